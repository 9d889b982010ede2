"""Invokers: how the API hands a run request to a runtime and gets the run result back.

The LocalInvoker runs the runtimes in this process's care (the embedded
default). A LambdaInvoker sends the same dict as the payload of the language's
Lambda function. Nothing above this seam knows which one is in use.
"""

from __future__ import annotations

from typing import Protocol

from runtimes.jail.supervisor import SandboxUnavailable
from runtimes.payload import RunRequest

__all__ = ["Invoker", "LocalInvoker", "SandboxUnavailable"]


class Invoker(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def invoke(self, request: RunRequest) -> dict: ...

    def ready(self) -> bool: ...

    def status(self) -> dict: ...


class LocalInvoker:
    """Runtimes on this machine, one per language, started with the service."""

    def __init__(self, runtimes: dict):
        self.runtimes = runtimes

    async def start(self) -> None:
        for runtime in self.runtimes.values():
            await runtime.start()

    async def stop(self) -> None:
        for runtime in self.runtimes.values():
            await runtime.stop()

    async def invoke(self, request: RunRequest) -> dict:
        runtime = self.runtimes.get(request.language)
        if runtime is None:
            raise SandboxUnavailable(f"no runtime for {request.language} on this service")
        return await runtime.run(request)

    def ready(self) -> bool:
        """Every runtime this machine can have is serving (a missing node only refuses nodejs runs)."""
        installed = [r for r in self.runtimes.values() if not r.missing()]
        return bool(installed) and all(r.ready for r in installed)

    def status(self) -> dict:
        return {language: runtime.status() for language, runtime in self.runtimes.items()}
