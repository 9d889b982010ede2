"""Packages an operator asked for, per language, on top of the base file; and the queue of builds that installs them.

The requirements file or package.json stays the base. What an operator adds
through the API, the CLI or the admin page is kept in the data dir,
`<data>/packages/<language>.json`:

- `installed`: the requested packages the serving layer was built with (so a
  restart finds that layer again: they are part of its key, layers/store.py);
- `pending`: changes (add a spec, remove a name) not yet in a layer, so that a
  restart in the middle of a build loses none of them.

Each change goes into a build. A change that arrives while a build runs joins
the next queued build of its language (one build for many changes: what a
person adding three packages in a row expects to wait for), and only one build
runs at a time, whichever language (layers/manager.py). A build installs the
serving layer's packages with its changes applied, in a layer of its own, and
the runtime switches to it live; only then does the list change. If it fails,
the old layer keeps serving and the build keeps its log and error: a build of
one change drops that change; a build of several retries each change alone, so
that one bad spec does not take the good ones with it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path

from layers import specs
from layers.builds import BUILDING, FINISHED, QUEUED, SWITCHING, Build
from layers.manager import LayerManager
from layers.requested import RequestedPackages
from layers.specs import PackageRefused, SpecError

log = logging.getLogger("sandlot.packages")

HISTORY = 30  # finished builds kept (and written to the data dir)


class PackageManager:
    """The requested packages of every language of the local backend, and the build queue."""

    def __init__(self, layers: LayerManager, runtimes: dict, data_dir: Path, allow_any: bool = False):
        self.layers = layers
        self.runtimes = runtimes
        self.allow_any = allow_any
        self.history_path = data_dir / "packages" / "builds.json"
        self._queue: list[Build] = []  # the package queue's builds waiting to run, in order
        self._builds: dict[int, Build] = {b.id: b for b in self._load_history()}  # every build known, by id
        self._next_id = max(self._builds, default=0) + 1
        self._wake = asyncio.Event()
        self._worker: asyncio.Task | None = None
        self.finished_hooks: list[Callable[[Build], None]] = []  # each queued build, once it has ended (metrics)
        layers.recorder = self._record_other_build

    # ---- what the routes ask ------------------------------------------------------------------------------------

    @property
    def languages(self) -> list[str]:
        return [language for language, layer in self.layers.layers.items() if layer.packages is not None]

    def editable(self, language: str) -> bool:
        return language in self.languages and language in self.runtimes

    def _packages(self, language: str) -> RequestedPackages:
        if not self.editable(language):
            raise PackageRefused(f"no {language} layer on this service", 404)
        packages = self.layers.layers[language].packages
        assert packages is not None
        return packages

    def listing(self, language: str) -> dict:
        """Every package of the language's layer with where it comes from; what is requested and pending."""
        layer = self.layers.layers[language]
        packages = self._packages(language)
        packages.load()
        key = specs.name_key(language)
        installed = {key(item["name"]): item for item in self.layers.installed(language)}
        base = {key(name) for name in layer.base_names()}
        pending: dict[str, dict] = {}
        for change in packages.pending:
            pending[change["name"]] = {
                "op": change["op"],
                "spec": change["spec"]["spec"] if change["op"] == "add" else None,
                "build": change.get("build"),
            }
        rows = []
        for name in sorted(set(installed) | base | set(packages.installed) | set(pending)):
            requested = packages.installed.get(name)
            kind = "requested" if requested else "base" if name in base else "dependency"
            if name not in installed and not requested and name not in base:
                kind = "pending"
            rows.append(
                {
                    "name": installed.get(name, {}).get("name") or name,
                    "version": installed.get(name, {}).get("version"),
                    "requested": requested.spec if requested else None,
                    "base": name in base,
                    "kind": kind,
                    "pending": pending.get(name),
                }
            )
        order = {"requested": 0, "pending": 1, "base": 2, "dependency": 3}
        rows.sort(key=lambda row: (order[row["kind"]], row["name"].lower()))
        latest = self.latest(language)
        return {
            "language": language,
            "editable": True,
            "base_file": layer.base_file(),
            "layer": self.layers.current(language),
            "packages": rows,
            "build": latest.to_dict(log=False) if latest else None,
        }

    def add(self, language: str, given: list[object]) -> tuple[Build, list[dict]]:
        """Queue adding these specs (all checked before any is queued): the build that will carry them, and the
        changes made."""
        packages = self._packages(language)
        if not given:
            raise SpecError("no package spec given")
        parsed = [specs.parse(language, spec, self.allow_any) for spec in given]
        names = [spec.name for spec in parsed]
        if len(set(names)) != len(names):
            raise SpecError("the same package is named twice")
        return self._enqueue(packages, [{"op": "add", "name": s.name, "spec": s.to_dict()} for s in parsed])

    def remove(self, language: str, given: list[object]) -> tuple[Build, list[dict]]:
        """Queue removing these requested packages (a package of the base file is refused: edit the file): the
        build that will carry it, and the changes made."""
        packages = self._packages(language)
        if not given:
            raise SpecError("no package name given")
        names = [specs.normalize_name(language, name) for name in given]
        packages.load()
        wanted = packages.wanted()
        key = specs.name_key(language)
        base = {key(name) for name in self.layers.layers[language].base_names()}
        for name in names:
            if name in wanted:
                continue
            if name in base:
                raise PackageRefused(
                    f"{name} comes from the base file ({self.layers.layers[language].base_file()}): remove it there "
                    "and rebuild (POST /v1/sandbox/dependencies/update)",
                    409,
                )
            raise PackageRefused(f"{name} is not a requested {language} package", 404)
        return self._enqueue(packages, [{"op": "remove", "name": name} for name in dict.fromkeys(names)])

    def build(self, build_id: int) -> Build | None:
        return self._builds.get(build_id)

    def latest(self, language: str) -> Build | None:
        """The build running now, else the next queued, else the last finished, of that language."""
        builds = [b for b in self._builds.values() if b.language == language]
        running = [b for b in builds if b.state in (BUILDING, SWITCHING)]
        queued = [b for b in builds if b.state == QUEUED]
        if running or queued:
            return max(running, key=lambda b: b.id) if running else min(queued, key=lambda b: b.id)
        return max(builds, key=lambda b: (b.finished_at or 0, b.id), default=None)

    def history(self, language: str | None = None) -> list[Build]:
        """Newest first."""
        return sorted((b for b in self._builds.values() if language in (None, b.language)), key=lambda b: -b.id)

    # ---- the queue ----------------------------------------------------------------------------------------------

    def _enqueue(self, packages: RequestedPackages, changes: list[dict]) -> tuple[Build, list[dict]]:
        language = packages.language
        build = next((b for b in self._queue if b.language == language and not b.solo), None)
        if build is None:
            build = self._new_build(language, "packages")
            self._queue.append(build)
        for change in changes:
            change["id"] = secrets.token_hex(6)
            change["build"] = build.id
            build.changes.append(change)
            build.say(f"queued: {describe(change)}")
        packages.queue(changes)
        self._wake.set()
        return build, changes

    def _new_build(self, language: str, trigger: str, solo: bool = False) -> Build:
        build = Build(self._next_id, language, trigger, solo=solo)
        self._next_id += 1
        self._builds[build.id] = build
        finished = sorted((b for b in self._builds.values() if b.finished), key=lambda b: b.id)
        for old in finished[:-HISTORY]:
            del self._builds[old.id]
        return build

    def _record_other_build(self, language: str, trigger: str) -> Build:
        """A build the package queue did not ask for (an update route, the periodic refresh): recorded too."""
        build = self._new_build(language, trigger)
        build.say("waiting for the build before it" if self.layers.building else "starting")
        build.on_finish = self._save_history
        return build

    async def start(self, after: Awaitable | None = None) -> None:
        """Start the worker; changes left pending by the last run are built once `after` (the runtimes' start) is
        done."""
        for language in self.languages:
            packages = self.layers.layers[language].packages
            if packages is not None and packages.pending:
                build = self._new_build(language, "resume")
                for change in packages.pending:
                    change["build"] = build.id
                    build.changes.append(change)
                    build.say(f"pending since the last run: {describe(change)}")
                packages.note_builds(build.changes)
                self._queue.append(build)
        self._worker = asyncio.create_task(self._work(after))

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping
                pass

    async def _work(self, after: Awaitable | None) -> None:
        if after is not None:
            try:
                await asyncio.shield(after)
            except Exception:  # noqa: BLE001 - the API logs a failed start; builds then fail saying why
                pass
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            build = self._queue.pop(0)
            try:
                await self._run(build)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - one build's surprise must not stop the queue
                log.exception("the %s build %d failed unexpectedly", build.language, build.id)
                if not build.finished:
                    build.finish(f"{type(exc).__name__}: {exc}")
            finally:
                self._save_history()
                for hook in self.finished_hooks:
                    hook(build)

    async def _run(self, build: Build) -> None:
        packages = self._packages(build.language)
        packages.load()  # another instance on this data dir may have changed the list
        candidate = packages.applied(build.changes)
        build.requested = [spec.spec for spec in candidate.values()]
        for change in build.changes:
            build.say(describe(change))
        try:
            await self.layers.rebuild(
                build.language,
                self.runtimes[build.language],
                requested=packages.render(candidate),
                record=build,
                switched=lambda _path: packages.commit(build.changes),
            )
        except Exception:  # noqa: BLE001 - the record holds the error (layers/manager.py)
            if not build.finished:
                raise
            self._failed(packages, build)
            return
        log.info("%s packages now: %s", build.language, ", ".join(build.requested) or "none requested")

    def _failed(self, packages: RequestedPackages, build: Build) -> None:
        if len(build.changes) > 1:
            retries = []
            for change in build.changes:
                retry = self._new_build(build.language, "retry", solo=True)
                retry.changes.append(change)
                change["build"] = retry.id
                retry.say(f"build {build.id} failed with several changes: this one on its own")
                retries.append(retry)
            build.retried_in = [retry.id for retry in retries]
            build.say(f"retrying each change on its own: builds {', '.join(str(i) for i in build.retried_in)}")
            self._queue[0:0] = retries
            packages.note_builds(build.changes)
            return
        build.dropped = list(build.changes)
        packages.forget(build.changes)
        for change in build.changes:
            build.say(f"dropped: {describe(change)}; the list is as it was")
        log.warning("%s build %d failed; the old layer keeps serving: %s", build.language, build.id, build.error)

    # ---- history ------------------------------------------------------------------------------------------------

    def _load_history(self) -> list[Build]:
        try:
            return [Build.restored(item) for item in json.loads(self.history_path.read_text())][-HISTORY:]
        except (OSError, ValueError, KeyError, TypeError):
            return []

    def _save_history(self) -> None:
        try:
            self.history_path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.history_path.with_name(self.history_path.name + ".new")
            finished = sorted((b for b in self._builds.values() if b.state in FINISHED), key=lambda b: b.id)
            temporary.write_text(json.dumps([b.saved() for b in finished[-HISTORY:]]))
            os.replace(temporary, self.history_path)
        except OSError as exc:
            log.warning("could not keep the build history in %s: %s", self.history_path, exc)


def describe(change: dict) -> str:
    if change["op"] == "add":
        return f"add {change['spec']['spec']}"
    return f"remove {change['name']}"
