"""The run contract's pydantic models: a run request, and a run result's wire shape.

RunRequest is runtimes/payload.py's name too (imported once asked for). RunResult
here is the wire schema of payload's RunResult (a plain dataclass, the one a run
gives): the OpenAPI's, and the check of a result from outside
(payload.RunResult.model_validate). See payload's docstring for why. This module
imports nothing of payload: payload uses it, not the other way round.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from runtimes.outcomes import RunOutcome


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    language: StrictStr
    code: Annotated[StrictStr, Field(min_length=1)]
    preload: StrictStr = ""
    enable_network: StrictBool = False
    timeout: Annotated[StrictFloat | StrictInt, Field(gt=0)] | None = None
    memory_limit_mb: Annotated[StrictInt, Field(gt=0)] | None = None
    stdin: StrictStr = ""

    def to_payload(self) -> dict:
        """The request as it travels (None fields left out)."""
        return self.model_dump(exclude_none=True)


class RunResult(BaseModel):
    """A run's result: `data` of the success envelope (also when the user's code failed), and what a runtime
    function returns. Unknown fields from a runtime are ignored. runtimes/payload.py's RunResult has the same
    fields (tests/test_contract.py keeps them equal)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    stdout: str = Field(description="the run's stdout, byte-exact (UTF-8, invalid bytes replaced)")
    stderr: str = Field(description="the run's stderr, byte-exact")
    error: str = Field(
        description="empty when exit_code is 0; otherwise `process exited with code N`, the sandbox's own lines "
        "(`error: timeout`, `error: output limit exceeded`, `error: operation not permitted`, "
        "`error: memory limit exceeded`) and the full stderr"
    )
    exit_code: int = Field(description="the process's exit code; -1 on timeout or output cap; 128+N for signal N")
    duration: float = Field(0.0, description="seconds the run took")
    truncated: bool = Field(False, description="output was cut at the output cap")
    outcome: RunOutcome = Field(
        description="how the run ended: ok, error, timeout, forbidden_syscall, output_limit or memory_limit"
    )

    def to_wire(self) -> dict:
        """The result as it travels: a plain JSON-ready dict."""
        return self.model_dump(mode="json")
