"""How a run ended, as the service itself observed it, and the run result built from it.

Nothing here trusts the child's output: exit status, signal, timeout and
truncation come from the zygote's reaping and the service's own accounting,
except the exit status a wrapper reports as it exits (execution.py), which can
only end its own run early, as exiting would.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

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

    def to_result(self) -> dict:
        stderr = self.stderr.decode("utf-8", "replace")
        code = self.exit_code()
        error = ""
        if code != 0:
            error = f"process exited with code {code}\n"
            error += "".join(line + "\n" for line in self.sandbox_lines()) + stderr
        return {
            "stdout": self.stdout.decode("utf-8", "replace"),
            "stderr": stderr,
            "error": error,
            "exit_code": code,
            "duration": round(self.duration, 6),
            "truncated": self.truncated,
        }
