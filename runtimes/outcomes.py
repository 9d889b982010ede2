"""How a run ended, in one word: the run contract's plain and pydantic sides both name it.

Standard library only: runtimes/payload.py (no pydantic) and runtimes/run_models.py
(pydantic's models of the same contract) import it, and neither imports the other
at import time (payload asks for run_models only when a model is needed).
"""

from __future__ import annotations

from enum import StrEnum


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
