"""How a run ended, as the service itself observed it, and the run result built from it.

Nothing here trusts the child's output: exit status, signal, timeout and
truncation come from the zygote's reaping and the service's own accounting,
except the exit status a wrapper reports as it exits (execution.py), which can
only end its own run early, as exiting would.

The result's outcome is decided here, once: from that accounting first, and
only for what the interpreter alone can tell (a MemoryError, V8's heap limit,
a PermissionError from the filter) from the run's stderr. A run can make its
own outcome read `memory_limit` by printing so; it cannot make another's.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from runtimes.payload import RunOutcome, RunResult

# what an interpreter says when the run hit its memory limit or the filter refused a call (lowercased)
_MEMORY_WORDS = ("memoryerror", "memory limit", "heap out of memory")
_FORBIDDEN_WORDS = ("operation not permitted",)

_SIGNAL_WORDS = {
    signal.SIGSYS: "operation not permitted",
    signal.SIGXCPU: "cpu time limit exceeded",
    signal.SIGXFSZ: "file size limit exceeded",
    signal.SIGSEGV: "segmentation fault",
    signal.SIGBUS: "bus error",
    signal.SIGABRT: "aborted",
    signal.SIGKILL: "killed",
}


@dataclass
class Outcome:
    stdout: bytes
    stderr: bytes
    signaled: bool
    status: int  # exit code, or signal number when signaled
    timed_out: bool
    truncated: bool
    duration: float
    ended_by: str = ""  # the service's own error line when it ended the run for a cap (e.g. /tmp's)

    def exit_code(self) -> int:
        if self.timed_out or self.truncated or self.ended_by:
            return -1
        return 128 + self.status if self.signaled else self.status

    def sandbox_lines(self) -> list[str]:
        if self.timed_out:
            return ["error: timeout"]
        if self.truncated:
            return ["error: output limit exceeded"]
        if self.ended_by:
            return [self.ended_by]
        if self.signaled:
            words = _SIGNAL_WORDS.get(self.status, "killed")
            return [f"error: {words} (signal {self.status})"]
        return []

    def run_outcome(self, stderr: str) -> RunOutcome:
        """The one word for how the run ended (stderr: the run's, decoded)."""
        if self.timed_out:
            return RunOutcome.TIMEOUT
        if self.truncated:
            return RunOutcome.OUTPUT_LIMIT
        if self.signaled and self.status == signal.SIGSYS:
            return RunOutcome.FORBIDDEN_SYSCALL
        if self.exit_code() == 0:
            return RunOutcome.OK
        said = stderr.lower()
        if any(words in said for words in _MEMORY_WORDS):
            return RunOutcome.MEMORY_LIMIT
        if any(words in said for words in _FORBIDDEN_WORDS):
            return RunOutcome.FORBIDDEN_SYSCALL
        return RunOutcome.ERROR

    def to_result(self) -> RunResult:
        stderr = self.stderr.decode("utf-8", "replace")
        code = self.exit_code()
        error = ""
        if code != 0:
            error = f"process exited with code {code}\n"
            error += "".join(line + "\n" for line in self.sandbox_lines()) + stderr
        return RunResult(
            stdout=self.stdout.decode("utf-8", "replace"),
            stderr=stderr,
            error=error,
            exit_code=code,
            duration=round(self.duration, 6),
            truncated=self.truncated,
            outcome=self.run_outcome(stderr),
        )
