"""Invokers: how the API hands a run request to a runtime and gets the run result back.

An Invoker runs requests and says whether it can (readiness, status). Layer
administration (listing, rebuilding the dependency layers) is a separate,
optional part: the LocalInvoker (handler/local_invoker.py) manages its layers on
this machine; the LambdaInvoker (handler/lambda_invoker.py) asks the runtime
function to list its layer, which is baked into its image. Nothing above this
seam knows which one is in use, and nothing here imports the jail.

The contract: invoke() returns a RunResult, or raises one of runtimes.payload's
errors (Unavailable, Throttled, InvalidRequest); each invoker turns whatever its
own machinery raises (the jail, boto3) into these at its seam.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from layers.store import LayerBuildError
from runtimes.payload import RunRequest, RunResult, Throttled, Unavailable

__all__ = ["Invoker", "LayerAdmin", "LayerBuildError", "Throttled", "Unavailable"]


class Invoker(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def invoke(self, request: RunRequest) -> RunResult:
        """The run result; raises Unavailable, Throttled or InvalidRequest instead of a result."""
        ...

    def ready(self) -> bool: ...

    def status(self) -> dict: ...


@runtime_checkable
class LayerAdmin(Protocol):
    """The optional part: dependency layers."""

    async def dependencies(self, language: str) -> list[dict[str, str]]: ...

    async def update_dependencies(self, language: str) -> None:
        """Rebuild the language's layer and switch to it; LayerBuildError says why not."""
        ...
