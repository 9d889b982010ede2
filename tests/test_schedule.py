"""The pooled schedule keeps as many children ready as the load needs: deeper under load, few when idle."""

import asyncio

import pytest

from runtimes.jail.service import schedule


class FakeChild:
    def __init__(self, number: int):
        self.pid = number
        self.exited = asyncio.get_running_loop().create_future()


class FakePool:
    """What PooledSchedule uses of a ChildPool; children are made at once, or when `release()` is called."""

    def __init__(self):
        self.on_replaced: list = []
        self.on_running: list = []
        self.on_idle: list = []
        self.last_error = ""
        self.made = 0
        self.killed: list[FakeChild] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self._tasks: set = set()
        self.down: set[str] = set()  # kinds of zygote that are not running
        self.parked: list[str] = []  # kinds parked (park), in order; unpark removes

    async def spawn(self, variant) -> FakeChild:
        await self.gate.wait()
        self.made += 1
        return FakeChild(self.made)

    def discard(self, child: FakeChild) -> None:
        self.killed.append(child)
        if not child.exited.done():
            child.exited.set_result((True, 9))

    def background(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def current(self, child) -> bool:
        return True

    def kind_running(self, kind: str) -> bool:
        return kind not in self.down

    def owner(self, child):
        return None

    def park(self, kind: str) -> None:
        self.parked.append(kind)
        self.down.add(kind)

    def unpark(self, kind: str) -> None:
        if kind in self.parked:
            self.parked.remove(kind)
            self.down.discard(kind)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.fixture
def quick_idle(monkeypatch):
    monkeypatch.setattr(schedule, "IDLE_SECONDS", 0.2)


def test_ready_children_follow_the_load(quick_idle):
    async def scenario():
        pool = FakePool()
        pooled = schedule.PooledSchedule(pool, {(): 4}, {(): 1})
        await pooled.start()
        await settle()
        assert pooled.status()["ready_children"] == 4  # a burst right after start is served at once

        pool.gate.clear()  # children are slow to make: runs outpace the making
        taken = [await pooled.take(()) for _ in range(4)]
        waiting = asyncio.ensure_future(pooled.take(()))  # none ready: it waits for one made for it
        await settle()
        pool.gate.set()
        taken.append(await waiting)
        assert pooled.made_on_demand == 1 and pooled.status()["ready_level"] == 5  # one deeper
        for child in taken:
            await pooled.finish(child)
        await settle()
        assert pooled.status()["ready_children"] == 5

        await asyncio.sleep(0.35)  # idle: down to one ready, the rest killed
        assert pooled.status()["ready_children"] == 1 and pooled.status()["ready_level"] == 1
        assert all(c.exited.done() for c in pool.killed)

        child = await pooled.take(())  # a run: back to the target
        await pooled.finish(child)
        await settle()
        assert pooled.status()["ready_children"] == 4
        await pooled.stop()

    asyncio.run(scenario())


def test_going_idle_is_told_once_until_runs_come_again(quick_idle):
    # the chroot mode drops the page cache of its trees then (provisions.py): what the surplus children mapped
    async def scenario():
        pool = FakePool()
        told = []
        pool.on_idle.append(lambda: told.append(pool.made))
        pooled = schedule.PooledSchedule(pool, {(): 3}, {(): 1})
        await pooled.start()
        await settle()
        await asyncio.sleep(0.35)
        assert len(told) == 1 and pooled.status()["ready_children"] == 1  # told once its surplus was let go
        await asyncio.sleep(0.3)
        assert len(told) == 1  # still idle: nothing more to let go, nothing told
        child = await pooled.take(())
        await pooled.finish(child)
        await asyncio.sleep(0.35)
        assert len(told) == 2
        await pooled.stop()

    asyncio.run(scenario())


def test_the_level_never_passes_twice_the_target(quick_idle):
    async def scenario():
        pool = FakePool()
        pooled = schedule.PooledSchedule(pool, {(): 2})
        await pooled.start()
        await settle()
        for _ in range(10):  # bursts of 5 runs at once: some find none ready every time
            children = [await pooled.take(()) for _ in range(5)]
            for child in children:
                await pooled.finish(child)
            await settle()
        assert pooled.status()["ready_level"] == 4 and pooled.status()["ready_children"] == 4
        await pooled.stop()

    asyncio.run(scenario())


def test_a_variant_without_an_idle_level_keeps_none_when_idle(quick_idle):
    async def scenario():
        pool = FakePool()
        pooled = schedule.PooledSchedule(pool, {(("network", True),): 2, (("network", False),): 1}, {})
        await pooled.start()
        await settle()
        assert pooled.status()["ready_children"] == 3
        await asyncio.sleep(0.35)
        assert pooled.status()["ready_children"] == 0  # an idle Node runtime holds no node
        await pooled.stop()

    asyncio.run(scenario())


def test_no_child_is_made_for_a_kind_of_zygote_that_is_down_until_it_runs_again():
    async def scenario():
        pool = FakePool()
        lean, main = (("zygote", "lean"),), ()
        pool.down.add("")  # the preloaded zygote is starting, or cannot start
        pooled = schedule.PooledSchedule(pool, {lean: 2, main: 2})
        await pooled.start()
        await settle()
        assert pool.made == 2  # the lean one's only: each finished run would otherwise retry the other's start
        child = await pooled.take(lean)
        await pooled.finish(child)
        await settle()
        assert pool.made == 3
        pool.down.clear()
        for callback in pool.on_running:  # the pool's own restart brought it up
            callback()
        await settle()
        assert pooled.status()["ready_children"] == 4
        await pooled.stop()

    asyncio.run(scenario())


def test_a_variant_idle_past_its_park_time_has_its_zygote_parked_until_a_run_wakes_it(quick_idle):
    async def scenario():
        pool = FakePool()
        lean, main = (("zygote", "lean"),), ()
        pooled = schedule.PooledSchedule(pool, {lean: 2, main: 2}, {lean: 1}, park={main: 0.3})
        await pooled.start()
        await settle()
        await asyncio.sleep(0.2)
        await pooled.take(main)  # a run of it: the park time counts from here
        await asyncio.sleep(0.2)
        assert pool.parked == []
        await asyncio.sleep(0.4)
        assert pool.parked == [""]  # the main zygote, once no run wanted it for 0.3 s; the lean one never
        pooled.wake(main)
        assert pool.parked == []
        await asyncio.sleep(0.15)
        assert pool.parked == []  # woken: the park time counts again from the wake
        await pooled.stop()

    asyncio.run(scenario())
