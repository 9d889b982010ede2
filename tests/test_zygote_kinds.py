"""Python's two zygotes: a lean one that imports nothing of the layer, and the preloaded one.

A run is forked by the lean one when its code imports only what that zygote holds, and by the
preloaded one otherwise (runtimes/python/imports.py reads the code); the pool keeps each kind of
zygote, rotates it and replaces it on its own (runtimes/jail/service/pool.py)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from runtimes.jail.service.pool import MAIN, ChildPool
from runtimes.payload import Unavailable
from runtimes.python.imports import imported_modules

# ---- what a run's code imports ----------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "modules"),
    [
        ("print('hi')", set()),
        ("import requests", {"requests"}),
        ("import os.path as p, json  # and a comment", {"os", "json"}),
        ("from jinja2.sandbox import SandboxedEnvironment\nx = 1; import httpx", {"jinja2", "httpx"}),
        ("if True: import numpy\n", {"numpy"}),
        ("import os, \\\n    pandas", {"os", "pandas"}),
        ("from . import sibling", set()),
        ("exec('import requests')", {"requests"}),  # in a string too: the preloaded zygote serves it
        ("print('an important line')", set()),
        ("import\x0cnumpy", {"numpy"}),  # a form feed is a blank to Python
        ("import json,\\\r\n numpy", {"json", "numpy"}),
        ("from\\\r\nnumpy import x", {"numpy"}),
    ],
)
def test_the_modules_a_code_imports_are_read_from_its_text(code, modules):
    assert imported_modules(code) == frozenset(modules)


@pytest.mark.parametrize(
    "code",
    [
        "m = __import__('requests')",
        "import importlib\nimportlib.import_module('x')",
        "import json\n" + "x = 1\n" * 20_000,  # longer than it reads: the preloaded zygote serves it
    ],
)
def test_a_code_that_imports_by_name_at_run_time_or_is_long_is_not_told_apart(code):
    assert imported_modules(code) is None


@pytest.mark.parametrize(
    "code",
    [
        "import a" + " " * 30_000 + "b",  # a backtracking pattern took 2.9 s for 16 kB of these
        "from" + " " * 15_000 + "x" + " " * 15_000 + "y",
        "import " + "a," * 15_000 + "!",
    ],
)
def test_a_hostile_code_is_read_in_time_linear_in_its_length(code):
    started = time.perf_counter()
    assert imported_modules(code) is not None  # read, not refused for its length
    assert time.perf_counter() - started < 0.5  # about 5 ms here; quadratic, tens of seconds


# ---- served through the API ----------------------------------------------------------------

HOLDS_HTTPX = "import sys\nprint('httpx' in sys.modules)"  # httpx: preloaded with the layer, imported by no run here


def _pasta_per_zygote(service) -> bool:
    """Without root, where each zygote brings a network namespace and a pasta: the preloaded one alone."""
    return bool(service.detail()["runtimes"]["python3"]["protections"].get("network_namespace"))


def _preloaded_zygote_awake(service) -> None:
    """The preloaded zygote running: an idle service parks it (schedule.py), and the first run that imports a
    layer package, served by the lean zygote meanwhile, starts it again."""
    deadline = time.monotonic() + 60
    while service.detail()["runtimes"]["python3"]["zygotes"] < 2:
        assert time.monotonic() < deadline, "the preloaded zygote was not started again"
        service.run("import requests")
        time.sleep(0.5)


@pytest.fixture
def lean(service):
    if _pasta_per_zygote(service):
        pytest.skip("one Python zygote here: without root each zygote brings a network namespace and a pasta")
    _preloaded_zygote_awake(service)
    return service


def test_a_run_that_imports_nothing_of_the_layer_is_forked_by_the_lean_zygote(lean):
    python = lean.detail()["runtimes"]["python3"]
    assert python["zygotes"] == 2 and python["ready"]
    assert lean.run(HOLDS_HTTPX)["data"]["stdout"] == "False\n"


def test_a_run_that_imports_a_layer_package_is_forked_by_the_preloaded_zygote(service):
    if not _pasta_per_zygote(service):
        _preloaded_zygote_awake(service)
    answer = service.run("import requests\n" + HOLDS_HTTPX)["data"]
    assert answer["stdout"] == "True\n", answer


def test_an_import_the_reading_misses_is_still_served_by_the_lean_zygote(lean):
    hidden = b"import jinja2; print(jinja2.Template('{{ n }}').render(n=7))".hex()
    answer = lean.run(f"exec(bytes.fromhex('{hidden}').decode())\n{HOLDS_HTTPX}")["data"]
    assert answer["stdout"] == "7\nFalse\n", answer


def test_dify_s_python_wrapper_is_forked_by_the_lean_zygote(lean):
    code = (
        "import json\nfrom base64 import b64decode\n"
        "def main(x: int) -> dict:\n    return {'y': x * 2}\n"
        "inputs = json.loads(b64decode('eyJ4IjogMjF9').decode('utf-8'))\n"
        "print(json.dumps(main(**inputs)))\n" + HOLDS_HTTPX
    )
    assert lean.run(code)["data"]["stdout"] == '{"y": 42}\nFalse\n'


def test_where_each_zygote_brings_a_pasta_the_preloaded_one_serves_every_run(service):
    if not _pasta_per_zygote(service):
        pytest.skip("two Python zygotes here (the runs' network needs no namespace of each zygote's own)")
    python = service.detail()["runtimes"]["python3"]
    assert python["zygotes"] == 1 and python["ready"]
    assert service.run(HOLDS_HTTPX)["data"]["stdout"] == "True\n"


# ---- the pool's kinds ------------------------------------------------------------------------


class FakeZygoteHandle:
    def __init__(self, kind: str, number: int):
        self.kind, self.number = kind, number
        self.alive, self.forks, self.live_children, self.tag = True, 0, 0, ""
        self.report = {"kind": kind, "number": number}
        self.on_exit: list = []

    async def stop(self) -> None:
        self.alive = False


class Factory:
    def __init__(self):
        self.made: list[FakeZygoteHandle] = []
        self.refuse: set[str] = set()
        self.slow = asyncio.Event()
        self.slow.set()
        self.main_asked = False

    async def __call__(self, kind: str) -> FakeZygoteHandle:
        if kind == MAIN and not any(z.kind == MAIN for z in self.made) and not self.main_asked:
            self.main_asked = True
            await self.slow.wait()  # the first start of a main zygote takes its time; later ones do not
        if kind in self.refuse:
            raise Unavailable(f"no {kind or 'main'} zygote")
        self.made.append(FakeZygoteHandle(kind, len(self.made)))
        return self.made[-1]


def test_the_first_kind_serves_at_once_and_the_others_come_up_beside_it():
    async def scenario():
        factory = Factory()
        factory.slow.clear()  # the main (preloaded) zygote takes its time
        pool = ChildPool(factory, None, None, max_forks=100, kinds=("lean", MAIN))
        report = await asyncio.wait_for(pool.start(), 5)  # the first kind alone is waited for
        assert report == {"kind": "lean", "number": 0}  # until the main one is up, the first one's
        assert pool.running and pool.kind_running("lean") and not pool.kind_running(MAIN)
        factory.slow.set()
        for _ in range(50):
            await asyncio.sleep(0)
        assert pool.kind_running(MAIN) and pool.report == {"kind": MAIN, "number": 1}
        assert pool.report_of("lean")["kind"] == "lean" and pool.status()["zygotes"] == 2
        await pool.stop()

    asyncio.run(scenario())


def test_zygotes_are_replaced_all_together_or_not_at_all():
    async def scenario():
        factory = Factory()
        pool = ChildPool(factory, None, None, max_forks=100, kinds=("lean", MAIN))
        await pool.start()
        for _ in range(50):
            await asyncio.sleep(0)
        lean, main = factory.made
        factory.refuse.add(MAIN)  # a new layer the main zygote cannot start on
        with pytest.raises(Unavailable):
            await pool.replace_zygote()
        fresh_lean = factory.made[-1]
        assert fresh_lean.kind == "lean" and not fresh_lean.alive  # started, then stopped again
        assert pool.report_of("lean") is lean.report and pool.report is main.report  # both as they were
        factory.refuse.clear()
        await pool.replace_zygote()
        assert not lean.alive and not main.alive  # retired (no child left)
        assert pool.report_of("lean") is factory.made[-2].report and pool.report is factory.made[-1].report
        await pool.replace_zygote(("lean",))  # one kind alone (its rotation)
        assert pool.report is factory.made[-2].report and pool.report_of("lean") is factory.made[-1].report
        await pool.stop()

    asyncio.run(scenario())


def test_a_replacement_during_a_kind_s_start_leaves_no_zygote_the_pool_does_not_hold():
    async def scenario():
        factory = Factory()
        factory.slow.clear()  # the main zygote's first start is under way (a layer switch comes meanwhile)
        pool = ChildPool(factory, None, None, max_forks=100, kinds=("lean", MAIN))
        await pool.start()
        replacing = asyncio.ensure_future(pool.replace_zygote())
        for _ in range(20):
            await asyncio.sleep(0)
        factory.slow.set()
        await asyncio.wait_for(replacing, 5)
        current = {id(pool.report_of("lean")), id(pool.report)}
        orphans = [z for z in factory.made if z.alive and id(z.report) not in current]
        assert orphans == []  # each one started is serving or stopped
        assert pool.report["kind"] == MAIN and pool.report is factory.made[-1].report
        await pool.stop()

    asyncio.run(scenario())


def test_an_idle_kind_is_parked_without_a_restart_and_unparked_on_demand():
    """The preloaded zygote is stopped while idle (its memory back) and started again when a run needs it; the
    first kind, which serves every run meanwhile, is never parked."""

    async def scenario():
        factory = Factory()
        pool = ChildPool(factory, None, None, max_forks=100, kinds=("lean", MAIN))
        await pool.start()
        for _ in range(50):
            await asyncio.sleep(0)
        lean, main = factory.made
        pool.park("lean")
        assert pool.kind_running("lean") and not pool.parked("lean")
        pool.park(MAIN)
        for _ in range(50):
            await asyncio.sleep(0)
        assert not main.alive and pool.parked(MAIN) and not pool.kind_running(MAIN)
        assert len(factory.made) == 2 and pool.status()["parked"] == ["main"]  # stopped, not restarted
        assert pool.running and lean.alive
        pool.unpark(MAIN)
        for _ in range(50):
            await asyncio.sleep(0)
        assert pool.kind_running(MAIN) and not pool.parked(MAIN) and factory.made[-1].kind == MAIN
        assert len(factory.made) == 3 and pool.status()["parked"] == []
        pool.park(MAIN)
        await pool.replace_zygote()  # a layer switch while parked: every kind on the new layer, none parked
        assert pool.kind_running(MAIN) and pool.status()["parked"] == []
        await pool.stop()

    asyncio.run(scenario())


def test_a_spawn_whose_zygote_is_replaced_while_its_tmp_is_made_forks_on_the_new_one():
    """A rotation stops the old zygote at once when it has no child; a spawn that took it and was making its
    child's /tmp meanwhile (a uid's first cell, in a thread) forks on the new one instead of failing its run with
    "the zygote is not running" (seen in CI under load)."""

    class Reached(Exception):
        pass

    class ForkingZygote(FakeZygoteHandle):
        tree_root = "/tree"

        async def fork(self, uid, inside, variant):
            if not self.alive:
                raise Unavailable("the zygote is not running")
            raise Reached(self.number)  # this zygote forked it (the test stops here)

    class SlowCells:  # a uid's first cell, made in a thread, held until the test lets it go
        def __init__(self):
            self.making, self.go = threading.Event(), threading.Event()

        def needs_cell(self, root, uid):
            return True

        def make(self, root, uid):
            self.making.set()
            assert self.go.wait(5)
            return f"/run/{uid}", "/tmp"

        def discard(self, tmpdir):
            pass

    async def scenario():
        made = []

        async def factory(kind):
            made.append(ForkingZygote(kind, len(made)))
            return made[-1]

        cells = SlowCells()
        pool = ChildPool(factory, None, None, max_forks=100, run_dirs=cells)
        await pool.start()
        spawning = asyncio.ensure_future(pool.spawn())
        assert await asyncio.to_thread(cells.making.wait, 5)
        await pool.replace_zygote()  # the old zygote has no child: stopped at once
        assert not made[0].alive and made[1].alive
        cells.go.set()
        with pytest.raises(Reached) as reached:
            await asyncio.wait_for(spawning, 5)
        assert reached.value.args == (1,)  # the new zygote forked it
        await pool.stop()

    asyncio.run(scenario())
