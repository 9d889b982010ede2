"""The HTTP body of POST /v1/sandbox/run, as Dify sends it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, StrictStr

from runtimes.payload import RunRequest, describe

__all__ = ["Dependency", "RunBody", "describe"]


class Dependency(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: StrictStr
    version: StrictStr = ""


class RunBody(RunRequest):
    """The run request plus what newer Dify sends and a request never acts on."""

    dependencies: list[Dependency] = []

    def run_request(self) -> RunRequest:
        fields = {name: getattr(self, name) for name in RunRequest.model_fields}
        return RunRequest.model_construct(**fields)
