"""What the zygote prepares once so that each child does less: the at-fork hooks made cheap
(runtimes/jail/zygote/forkhooks.py), the fixed part of the Landlock domain (landlock.Prepared), and the
exit of a run that started no thread. Each must leave a run exactly as it was."""

import os
import struct
import subprocess
import sys
import textwrap

import pytest

from runtimes.linux import landlock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python(source: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)],
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_hooks_are_cheap_in_the_zygote_and_the_modules_own_again_in_each_child():
    done = python(
        """
        import logging, os, threading
        from runtimes.jail.zygote.forkhooks import ForkHooks
        def codes():
            return threading._after_fork.__code__, logging._after_at_fork_child_reinit_locks.__code__
        own = codes()
        hooks = ForkHooks()
        print(hooks.quiet())
        print(*(now is before for now, before in zip(codes(), own)))
        pid = os.fork()
        if pid == 0:
            hooks.restore()
            print(*(now is before for now, before in zip(codes(), own)))
            # the child's locks work: logging's module lock was released by the cheap hook, threads start and join
            logging.basicConfig(format="%(message)s", level=logging.INFO)
            worker = threading.Thread(target=lambda: logging.info("logged from a thread"))
            worker.start()
            worker.join(5)
            print("joined", not worker.is_alive(), flush=True)
            os._exit(0)
        print("child", os.waitpid(pid, 0)[1])
        """
    )
    assert done.returncode == 0, done.stderr
    expected = ["['threading', 'logging']", "False False", "True True", "joined True", "child 0"]
    assert done.stdout.splitlines() == expected
    assert done.stderr == "logged from a thread\n"


def test_nothing_is_swapped_while_another_thread_lives():
    done = python(
        """
        import threading, time
        from runtimes.jail.zygote.forkhooks import ForkHooks
        own = threading._after_fork.__code__
        stop = threading.Event()
        threading.Thread(target=stop.wait).start()
        print(ForkHooks().quiet(), threading._after_fork.__code__ is own)
        stop.set()
        """
    )
    assert done.stdout == "[] True\n", done.stderr


@pytest.fixture
def abi():
    try:
        return landlock.abi_version()
    except OSError as exc:
        pytest.skip(f"no Landlock here: {exc}")


def test_a_prepared_domain_allows_what_restrict_allows_in_every_child(abi, tmp_path):
    """Made once by the zygote, entered by many children: each may write its own place and the devices,
    nothing else, and the prepared rules survive every child."""
    mine, other = tmp_path / "mine", tmp_path / "other"
    mine.mkdir()
    other.mkdir()
    done = python(
        f"""
        import os
        from runtimes.linux import syscalls as linux
        from runtimes.linux import landlock
        prepared = landlock.Prepared({abi}, ("/dev/null",))
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                linux.set_no_new_privs()
                prepared.restrict(writable=({str(mine)!r},))
                results = []
                for path in ({str(mine / "f")!r}, {str(other / "f")!r}, "/dev/null"):
                    try:
                        with open(path, "a") as f:
                            f.write("x")
                        results.append("written")
                    except PermissionError:
                        results.append("refused")
                print(*results, flush=True)
                os._exit(0)
            os.waitpid(pid, 0)
        """
    )
    assert done.stdout == "written refused written\n" * 3, done.stderr


def test_a_run_ends_as_a_script_does_with_and_without_threads(service):
    """Threads joined before the exit hooks, the exit hooks run, logging's output flushed; a run that
    started none ends the same way without threading's own exit."""
    code = (
        "import atexit, concurrent.futures, logging, sys, threading, time\n"
        "logging.basicConfig(level=logging.INFO, format='%(message)s', stream=sys.stdout)\n"
        "atexit.register(lambda: print('atexit'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n"
        "pool = concurrent.futures.ThreadPoolExecutor(1)\n"
        "pool.submit(lambda: (time.sleep(0.3), print('worker')))\n"
        "logging.getLogger('urllib3').warning('through the logger of a layer library')\n"
        "logging.info('logged')\n"
        "print('main')\n"
    )
    data = service.run(code)["data"]
    assert data["stdout"] == "through the logger of a layer library\nlogged\nmain\nthread\nworker\natexit\n"
    assert data["stderr"] == ""
    plain = service.run("import atexit\natexit.register(lambda: print('atexit'))\nprint('main')")["data"]
    assert plain["stdout"] == "main\natexit\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: namespaces made by unshare and setns")
def test_the_unshare_way_gives_each_child_namespaces_of_its_own_and_the_zygote_keeps_its_own():
    done = python(
        """
        import os, socket
        from runtimes.linux import syscalls as linux
        from runtimes.linux.namespaces import Forker
        forker = Forker(linux.CLONE_NEWPID | linux.CLONE_NEWNS | linux.CLONE_NEWUTS | linux.CLONE_NEWIPC)
        print(forker._own_pid_namespace >= 0)  # the unshare way, not the raw clone
        own = {kind: os.stat(f"/proc/self/ns/{kind}").st_ino for kind in ("pid", "mnt", "uts", "ipc")}
        # the three children live together while their PID namespaces are compared: a namespace freed by a
        # child reaped before the next one's is made may give its inode number to that next one
        hold, release = os.pipe()
        seen, children = [], []
        for n in range(3):
            pid = forker.fork()
            if pid == 0:
                os.read(hold, 1)  # alive until the zygote has looked at every child's PID namespace
                forker.child()
                socket.sethostname(f"child{n}")
                mine = [os.stat(f"/proc/self/ns/{kind}").st_ino for kind in ("mnt", "uts", "ipc")]
                os._exit(0 if os.getpid() == 1 and not set(mine) & set(own.values()) else 1)
            children.append(pid)
            seen.append(os.readlink(f"/proc/{pid}/ns/pid"))
        os.write(release, b"xxx")
        for pid in children:
            print(os.waitpid(pid, 0)[1], end=" ")
        print(len(set(seen)), socket.gethostname() != "child2")
        # the zygote's next plain child is in the zygote's own PID namespace again
        pid = os.fork()
        if pid == 0:
            os._exit(0 if os.getpid() != 1 else 1)
        print(os.waitpid(pid, 0)[1], os.stat("/proc/self/ns/pid").st_ino == own["pid"])
        """
    )
    assert done.stdout.splitlines() == ["True", "0 0 0 3 True", "0 True"], done.stderr


def _collapse_probe() -> subprocess.CompletedProcess:
    """A process that maps 8 MiB, fills it, has warmheap.collapse it, then forks a child that writes to it."""
    return python(
        """
        import mmap, os
        from runtimes.jail.zygote import warmheap
        maps = warmheap.Maps()
        area = mmap.mmap(-1, 8 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        area.write(bytes(range(256)) * (len(area) // 256))
        made = warmheap.collapse(maps)
        huge = sum(int(line.split()[1]) for line in open("/proc/self/smaps") if line.startswith("AnonHugePages"))
        print(made, huge)
        pid = os.fork()
        if pid == 0:
            ok = area[: 1 << 20] == bytes(range(256)) * 4096
            area[4096:4100] = b"kid!"  # the child's copy only
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), area[4096:4100] == bytes(range(4)))
        """
    )


def test_the_warm_heap_is_put_in_huge_pages_and_forks_still_copy_what_they_write():
    done = _collapse_probe()
    assert done.returncode == 0, done.stderr
    (made, huge), (child, parent_unchanged) = (line.split() for line in done.stdout.splitlines())
    if int(made) == 0:
        pytest.skip("this kernel or platform refuses MADV_COLLAPSE (Linux 6.1+): the heap stays as it was")
    assert int(huge) >= 2048  # at least one 2 MiB page, mapped as one
    assert child == "0" and parent_unchanged == "True"  # the child read the same bytes; its write stayed its own


def test_the_zygote_reports_its_huge_pages_and_runs_are_unchanged(service):
    detail = service.detail()["runtimes"]["python3"]
    supported = int(_collapse_probe().stdout.split()[0]) > 0
    assert (detail["huge_pages"] > 0) == supported
    answer = service.run("import json; print(json.dumps({'a': [1, 2]}))")
    assert answer["data"]["stdout"] == '{"a": [1, 2]}\n'


def test_the_pages_malloc_only_holds_freed_memory_in_go_back_to_the_kernel():
    done = python(
        """
        from runtimes.linux import syscalls as linux
        def rss():
            return int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("RssAnon")))
        chunks = [bytearray(1000) for _ in range(40000)]  # malloc's heap (too big for the interpreter's own)
        last = bytearray(1000)  # keeps the heap's top in use: malloc itself gives back only its top
        del chunks
        before = rss()
        print(linux.malloc_trim(), before - rss(), len(last))
        """
    )
    assert done.returncode == 0, done.stderr
    trimmed, freed_kib, _ = done.stdout.split()
    if trimmed == "False":
        pytest.skip("no malloc_trim in this C library")
    assert int(freed_kib) > 20 * 1024  # most of the 40 MB freed went back


def test_a_fork_request_carries_its_uid_tmpdir_and_variant_and_a_cut_short_one_is_refused():
    from runtimes.jail import protocol

    tmpdir = "/var/lib/sandlot/trees/k\u00e9y/tmp/70001"  # any path the data dir may have
    for variant in ({}, {"memory_mb": 256, "network": True}, {"network": False, "memory_mb": 128}):
        request = protocol.fork_request(70001, tmpdir, variant)
        assert request[:1] == protocol.FORK
        uid, path, parsed = protocol.parse_fork_request(request[1:])
        assert (uid, path, dict(parsed)) == (70001, tmpdir, variant)
        with pytest.raises(TypeError):
            parsed["network"] = True  # one object serves every request naming it: nobody may change it
    again = protocol.parse_fork_request(protocol.fork_request(70002, "/tmp", {"network": True, "memory_mb": 256})[1:])
    assert dict(again[2]) == {"memory_mb": 256, "network": True} and again[:2] == (70002, "/tmp")
    many = [protocol.parse_fork_request(protocol.fork_request(7, "/t", {"memory_mb": n})[1:]) for n in range(100)]
    assert [dict(v) for _u, _t, v in many] == [{"memory_mb": n} for n in range(100)]  # past those kept, still right
    with pytest.raises((ValueError, struct.error)):
        protocol.parse_fork_request(protocol.fork_request(7, tmpdir, {})[1:20])
