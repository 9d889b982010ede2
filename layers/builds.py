"""A layer build as the operator sees it: what it carries, its state, its log as it comes, its error.

Every build of a layer on the local backend gets one (a package change, the
dify-sandbox update and refresh routes, the periodic refresh): the API's build
routes, `sandlot packages build-log` and the admin page read them. The log is
kept line by line with absolute line numbers, so a reader that follows a build
asks for the lines after the last one it has. The last builds, with the tail of
their logs, are written to the data dir so that a failure is still there to
read after a restart.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

QUEUED, BUILDING, SWITCHING, SUCCEEDED, FAILED = "queued", "building", "switching", "succeeded", "failed"
FINISHED = (SUCCEEDED, FAILED)
LOG_LINES = 5000  # kept per running build; older lines are dropped (their numbers are not reused)
LOG_LINE_CHARS = 500  # a longer line is cut
FINISHED_LINES = 1000  # kept once it has ended (the error is at the end)
SAVED_LINES = 400  # a finished build's log lines kept across restarts


@dataclass
class Build:
    id: int
    language: str
    trigger: str  # what asked for it: "packages", "update", "refresh", "periodic refresh", "resume"
    changes: list[dict] = field(default_factory=list)  # {"op": "add"|"remove", "name", "spec"}
    solo: bool = False  # a retry of one change on its own: no other change joins it
    state: str = QUEUED
    queued_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    error: str = ""
    layer: str = ""  # the layer it made (succeeded) or would have made
    requested: list[str] = field(default_factory=list)  # the requested specs it built with
    retried_in: list[int] = field(default_factory=list)  # failed with several changes: each retried alone here
    dropped: list[dict] = field(default_factory=list)  # changes given up because this build failed
    _lines: list[str] = field(default_factory=list, repr=False)
    _first_line: int = 0  # absolute number of _lines[0]
    _partial: str = field(default="", repr=False)
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False)
    on_finish: Callable[[], None] | None = field(default=None, repr=False)

    # ---- the log ------------------------------------------------------------------------------------------------

    def output(self, raw: bytes) -> None:
        """Bytes from the build tool (called from the build's thread)."""
        self.write(raw.decode(errors="replace"))

    def write(self, text: str) -> None:
        with self._guard:
            text = (self._partial + text).replace("\r\n", "\n").replace("\r", "\n")
            *complete, self._partial = text.split("\n")
            for line in complete:
                self._lines.append(line[:LOG_LINE_CHARS])
            excess = len(self._lines) - LOG_LINES
            if excess > 0:
                del self._lines[:excess]
                self._first_line += excess

    def say(self, line: str) -> None:
        """A line of Sandlot's own (what starts, what failed), set apart from the tool's output."""
        self.write(("\n" if self._partial else "") + f"sandlot: {line}\n")

    def lines(self, offset: int | None = None, tail: int = 200) -> tuple[int, list[str]]:
        """(number of the first line returned, lines): from offset on, or the last `tail` lines."""
        with self._guard:
            lines = self._lines + ([self._partial] if self._partial and self.state in FINISHED else [])
            end = self._first_line + len(lines)
            start = max(end - max(tail, 0), self._first_line) if offset is None else max(offset, self._first_line)
            return start, lines[start - self._first_line :]

    @property
    def line_count(self) -> int:
        with self._guard:
            return self._first_line + len(self._lines)

    # ---- state ----------------------------------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def start(self) -> None:
        self.state = BUILDING
        self.started_at = time.time()

    def finish(self, error: str = "") -> None:
        self.error = error
        self.state = FAILED if error else SUCCEEDED
        self.finished_at = time.time()
        with self._guard:
            excess = len(self._lines) - FINISHED_LINES
            if excess > 0:
                del self._lines[:excess]
                self._first_line += excess
        if self.on_finish is not None:
            self.on_finish()

    def to_dict(self, offset: int | None = None, tail: int = 200, log: bool = True) -> dict:
        data = {
            "id": self.id,
            "language": self.language,
            "trigger": self.trigger,
            "state": self.state,
            "changes": list(self.changes),
            "queued_at": self.queued_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "duration": round((self.finished_at or time.time()) - self.started_at, 3) if self.started_at else None,
            "error": self.error,
            "layer": self.layer,
            "requested": list(self.requested),
            "retried_in": list(self.retried_in),
            "dropped": list(self.dropped),
        }
        if log:
            first, lines = self.lines(offset, tail)
            data["log"] = {"first_line": first, "next_offset": first + len(lines), "lines": lines}
        return data

    def saved(self) -> dict:
        """What is kept across restarts: everything but the older log lines."""
        return self.to_dict(tail=SAVED_LINES)

    @classmethod
    def restored(cls, data: dict) -> Build:
        build = cls(int(data["id"]), str(data["language"]), str(data.get("trigger", "")))
        for name in ("changes", "requested", "retried_in", "dropped"):
            setattr(build, name, list(data.get(name) or []))
        build.state = data.get("state") if data.get("state") in FINISHED else FAILED
        build.error = str(data.get("error") or ("" if build.state == SUCCEEDED else "interrupted by a restart"))
        build.layer = str(data.get("layer") or "")
        build.queued_at = float(data.get("queued_at") or 0)
        build.started_at = data.get("started_at")
        build.finished_at = data.get("finished_at") or build.started_at
        log = data.get("log") or {}
        build._first_line = int(log.get("first_line") or 0)
        build._lines = [str(line) for line in log.get("lines") or []]
        return build
