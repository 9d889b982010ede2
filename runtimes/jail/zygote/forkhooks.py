"""The interpreter's at-fork hooks that only matter to other threads, made cheap in the zygote.

On every fork the interpreter runs what modules registered with
os.register_at_fork. Two of them, threading's and logging's, exist because
another thread may hold a lock at the moment of the fork: in the child they
make every lock of those modules anew and rebuild threading's table of
threads. A zygote has one thread, and it forks from its own loop, never inside
threading or logging, so in its children they change nothing; yet, as the first
Python code a child runs, they cost it about a quarter of a millisecond of CPU
and a hundred page copies (bench/fork_cost.py), more than any single step of
its confinement.

`quiet()`, in the zygote once it has warmed and only while it has no other
thread, swaps the code of those two hooks for what a single-threaded fork
still needs: threading's nothing, logging's the release of its module lock,
which its own `before` hook took in the zygote. Every other hook (random's
reseed among them) runs as before. `restore()`, in each child before anything
else, puts the modules' own code back, so that whatever the run does after
(a fork of its own, where seccomp allows it) meets the real hooks.

Standard library only (the zygote imports it before it confines itself).
"""

from __future__ import annotations

import sys
from types import CodeType, FunctionType

# What a fork from a single thread that holds no lock of these modules still needs, compiled to
# run in the module's own globals. logging's `before` hook acquired its module lock in the parent.
_SINGLE_THREAD_CHILD = {
    "threading": ("_after_fork", "pass"),
    "logging": ("_after_at_fork_child_reinit_locks", "_lock._at_fork_reinit()"),
}


class ForkHooks:
    def __init__(self) -> None:
        self._swapped: list[tuple[FunctionType, CodeType]] = []  # (hook, its own code)

    def quiet(self) -> list[str]:
        """In the zygote: the cheap hooks in place; the modules whose hooks were swapped. Nothing is swapped
        while another Python thread exists (its locks are why the hooks are there)."""
        threading = sys.modules.get("threading")
        if threading is not None and threading.active_count() != 1:
            return []
        for module_name, (hook_name, body) in _SINGLE_THREAD_CHILD.items():
            module = sys.modules.get(module_name)
            hook = getattr(module, hook_name, None)
            if not isinstance(hook, FunctionType) or hook.__code__.co_freevars:
                continue  # not the function this knows: left as it is
            scope: dict = {}
            exec(compile(f"def {hook_name}():\n    {body}\n", f"<sandlot {module_name} fork hook>", "exec"), scope)
            self._swapped.append((hook, hook.__code__))
            hook.__code__ = scope[hook_name].__code__
        return [hook.__module__ for hook, _code in self._swapped]

    def restore(self) -> None:
        """In a child, first: the modules' own hooks back."""
        for hook, code in self._swapped:
            hook.__code__ = code
