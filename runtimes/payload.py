"""The run contract: run request, run result and the errors a run can meet instead of a result.

The same shapes cross every seam: what the LocalInvoker hands a runtime, what the
LambdaInvoker sends as a runtime function's payload and gets back, what a direct
invoke of the API function carries. On the wire a result is dify-sandbox's dict
(stdout, stderr, error, exit_code) plus duration, truncated and outcome; in code
it is a RunResult, whose outcome is decided once, where the result is built (the
jail, runtimes/jail/outcome.py), and only read everywhere else (metrics, logs,
the CLI). This module imports nothing of the jail, so the API function (a zip on
Lambda, no libseccomp there) can use it.
"""

from __future__ import annotations

import json
import math
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

LANGUAGES = ("python3", "nodejs")

NETWORK_DISABLED = "network is disabled, please enable it in the configuration"
UNSUPPORTED_LANGUAGE = "unsupported language"

# Lambda's synchronous invocation limits: the request payload, and the response a runtime may post.
LAMBDA_REQUEST_LIMIT = 6_291_456
LAMBDA_RESPONSE_LIMIT = 6_291_556
OUTPUT_LIMIT_LINE = "error: output limit exceeded"
# The tenant id the API shares between all its runs where a runtime function reports seccomp in force
# (SANDLOT_LAMBDA_TENANCY=auto). A function without the filter refuses it: runs there need ids of their own.
SHARED_TENANT = "shared"


class Unavailable(RuntimeError):
    """The sandbox cannot run this now (runtime down, jail cannot be built): a -500 envelope naming why.

    The one such error: each invoker turns what its own machinery raises into this at its seam."""


class TenantRefused(Unavailable):
    """A runtime function's environment does not serve this invocation's tenant id (none, the shared one where no
    seccomp filter is in force, or another tenant's): refused before anything of the run was executed."""


class Throttled(RuntimeError):
    """Too many runs at once further down (e.g. Lambda's concurrency): the 503 envelope."""


class InvalidRequest(ValueError):
    """The run request breaks a rule (shape, language, network): a -400 envelope with this message."""

    def __init__(self, message: str, http_status: int = 400):
        super().__init__(message)
        self.http_status = http_status


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


class RunOutcome(StrEnum):
    """How a run ended, in one word: what metrics count and logs say. `refused` is never a result's:
    it names a run that got no result (Unavailable, Throttled), for the counters."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    FORBIDDEN_SYSCALL = "forbidden_syscall"
    OUTPUT_LIMIT = "output_limit"
    MEMORY_LIMIT = "memory_limit"
    REFUSED = "refused"


class RunResult(BaseModel):
    """A run's result: `data` of the success envelope (also when the user's code failed), and what a runtime
    function returns. Unknown fields from a runtime are ignored."""

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


def describe(errors: list[dict]) -> str:
    """pydantic's errors in one line a client can act on."""
    parts = []
    for err in errors:
        where = ".".join(str(p) for p in err["loc"])
        message = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


def parse_request(data: object, network_allowed: bool, model: type[RunRequest] = RunRequest) -> RunRequest:
    """A run request from a decoded body or event, every rule checked; InvalidRequest says what is wrong."""
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object")
    if "language" in data and data["language"] not in LANGUAGES:
        raise InvalidRequest(UNSUPPORTED_LANGUAGE)
    try:
        request = model.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequest(describe(exc.errors())) from exc
    if request.enable_network and not network_allowed:
        raise InvalidRequest(NETWORK_DISABLED, http_status=200)  # dify-sandbox answers this one with 200
    return request


def encoded_size(value: object, ascii_only: bool) -> int:
    return len(json.dumps(value, ensure_ascii=ascii_only).encode())


def fit_result(result: RunResult, limit: int, ascii_only: bool = True) -> RunResult:
    """The result, or one cut down to `limit` encoded bytes that says `error: output limit exceeded`.

    ascii_only: whether the transport escapes non-ASCII as \\uXXXX (awslambdaric does, unless the
    platform names python3.12+), which can make a result six times its character count.
    """
    wire = result.to_wire()
    if encoded_size(wire, ascii_only) <= limit:
        return result
    cut = dict(wire, exit_code=-1, truncated=True, outcome=RunOutcome.OUTPUT_LIMIT.value)
    header = f"process exited with code -1\n{OUTPUT_LIMIT_LINE}\n"
    stdout, stderr = cut.get("stdout", ""), cut.get("stderr", "")
    while True:
        cut.update(stdout=stdout, stderr=stderr, error=header + stderr)
        excess = encoded_size(cut, ascii_only) - limit
        if excess <= 0:
            return RunResult.model_validate(cut)
        # drop about as many characters as the excess is worth at their average encoded size
        if stdout:
            stdout = stdout[: len(stdout) - _chars_worth(stdout, excess, ascii_only)]
        elif stderr:
            stderr = stderr[: len(stderr) - _chars_worth(stderr, (excess + 1) // 2, ascii_only)]  # counted twice
        else:
            raise ValueError(f"a result cannot fit {limit} bytes")


def _chars_worth(text: str, size: int, ascii_only: bool) -> int:
    """How many characters from the end of text encode to about `size` bytes (at least one)."""
    per_char = max(1.0, (encoded_size(text, ascii_only) - 2) / len(text))
    return min(len(text), max(1, math.ceil(size / per_char)))
