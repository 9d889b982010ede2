"""An operator's requested packages for one language, as kept in the data dir (`<data>/packages/<language>.json`).

The file's format and the queue of builds that installs them: layers/packages.py. The layer manager
(layers/manager.py) holds one per language; the package manager changes them.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from layers import specs
from layers.specs import PackageSpec
from layers.store import LayerBuildError, Requested


class RequestedPackages:
    """One language's requested packages and pending changes, as kept in the data dir.

    Several instances may share a data dir (layers/store.py): every change to the file is made under an
    exclusive flock, on the file as it is then (read again first), so that no instance overwrites another's
    changes. Another instance's additions reach this one's layer with its next build or restart."""

    def __init__(self, language: str, path: Path):
        self.language = language
        self.path = path
        self.installed: dict[str, PackageSpec] = {}
        self.pending: list[dict] = []  # {"id", "op", "name", "spec"?: PackageSpec dict, "build": id}
        self.load()

    def load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
            self.installed = {item["name"]: PackageSpec.from_dict(item) for item in data.get("installed") or []}
            self.pending = [change for change in data.get("pending") or [] if change.get("op") in ("add", "remove")]
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LayerBuildError(
                f"{self.path}: unreadable list of requested {self.language} packages ({exc}): fix or remove it"
            ) from exc

    @contextmanager
    def changing(self) -> Iterator[None]:
        """Read the file again, let the block change the lists, write them back: all under the lock."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self.load()
            yield
            self.save()
        finally:
            os.close(fd)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "language": self.language,
            "installed": [spec.to_dict() for spec in self.installed.values()],
            "pending": self.pending,
        }
        temporary = self.path.with_name(self.path.name + ".new")
        temporary.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(temporary, self.path)  # whole or not at all

    def applied(self, changes: list[dict]) -> dict[str, PackageSpec]:
        """The installed list with changes applied, in order."""
        result = dict(self.installed)
        for change in changes:
            if change["op"] == "add":
                result[change["name"]] = PackageSpec.from_dict(change["spec"])
            else:
                result.pop(change["name"], None)
        return dict(sorted(result.items()))

    def wanted(self) -> dict[str, PackageSpec]:
        """Where the list is heading: installed, with every pending change applied."""
        return self.applied(self.pending)

    def render(self, packages: dict[str, PackageSpec] | None = None) -> Requested:
        """What a build gets: pip requirement lines, or npm name -> range."""
        packages = self.installed if packages is None else packages
        if specs.syntax(self.language) == "npm":
            return {name: spec.build for name, spec in sorted(packages.items())}
        return [spec.build for _name, spec in sorted(packages.items())]

    def commit(self, changes: list[dict]) -> None:
        """A build with these changes now serves: they are installed."""
        with self.changing():
            self.installed = self.applied(changes)
            self._drop(changes)

    def forget(self, changes: list[dict]) -> None:
        """Changes given up (their build failed)."""
        with self.changing():
            self._drop(changes)

    def queue(self, changes: list[dict]) -> None:
        with self.changing():
            self.pending.extend(changes)

    def note_builds(self, changes: list[dict]) -> None:
        """Changes that moved to other builds (retries, a resumed queue)."""
        moved = {change["id"]: change["build"] for change in changes}
        with self.changing():
            for change in self.pending:
                change["build"] = moved.get(change["id"], change.get("build"))

    def _drop(self, changes: list[dict]) -> None:
        done = {change["id"] for change in changes}
        self.pending = [change for change in self.pending if change["id"] not in done]
