"""The run request and run result: the one seam between the API and the runtimes.

The same dict is what the LocalInvoker hands a runtime and what the
LambdaInvoker sends as a runtime function's payload.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

LANGUAGES = ("python3", "nodejs")


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    language: StrictStr
    code: Annotated[StrictStr, Field(min_length=1)]
    preload: StrictStr = ""
    enable_network: StrictBool = False
    timeout: Annotated[StrictFloat | StrictInt, Field(gt=0)] | None = None
    memory_limit_mb: Annotated[StrictInt, Field(gt=0)] | None = None
    stdin: StrictStr = ""
