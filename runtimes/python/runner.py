"""Runs inside the Python zygote and its children.

prepare(): in the zygote, before it confines itself: build the seccomp filters
and check that one can be loaded here; bound what each thread of a run costs in
address space (`bound_thread_memory`).
warm():    in the zygote, inside its tree: import the dependency layer.
run():     in a confined child: read the run from stdin, set the run's limits,
           load the filter, run the code as __main__, report its status on fd 3
           and exit with it.

Where runs have PID namespaces the child is pid 1 of its own, and the kernel
spares a pid 1 every signal it sends itself while that signal's action is the
default (SIGKILL included). So that such a signal still ends the run as it ends
any other process, the zygote installs a shim before it forks (`as_pid_one`): a
handler that ends the run on each signal that would have ended it (timers and
limits included), and os.kill, os.abort, signal.raise_signal and
signal.pthread_kill that do so for SIGKILL and the fault signals aimed at the
run itself. Ending "by signal N" is the report KILLED_BY N on fd 3, then an
exit; the service then says the run was killed by N, as it would have been.
(Signals sent by raw system calls, through ctypes, with their default action
are ignored, as for any pid 1.)
"""

from __future__ import annotations

import atexit
import builtins
import ctypes
import errno
import importlib
import io
import json
import linecache
import os
import signal
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field

from runtimes.jail import protocol
from runtimes.jail.policy import allowlist
from runtimes.jail.zygote import confine
from runtimes.python.runner_config import PythonRunnerConfig

MIB = 1024 * 1024
SETUP_FAILED = 125
REPORTS_EXIT = True  # run() writes the exit status on fd 3 (the ready pipe) before it exits
_REPORT_FD = 3
_HEADER = protocol.RUN_HEADER

# Threads at the default memory limit (RLIMIT_AS: address space, not pages in use). glibc gives each
# new thread a malloc arena of its own, 64 MiB of address space each (up to 8 per core), and a stack
# of RLIMIT_STACK's size (8 MiB): 512 MiB held about 7 threads. One arena (the main one, a lock
# shared by the threads, which hold the GIL for most allocations anyway; each thread keeps its
# tcache) and 4 MiB stacks (twice what recursion to Python's limit through C calls needs, as
# Node's worker threads have) leave room for 64 threads and most of the limit for the run's data.
M_ARENA_MAX = -8
ARENAS = 1
THREAD_STACK_BYTES = 4 * MIB
_PTHREAD_ATTR_BYTES = 64  # sizeof(pthread_attr_t): 56 on x86_64, 64 on aarch64


@dataclass
class State:
    filters: dict  # by network flag; empty when this platform refuses seccomp
    required: bool  # refuse to run without a filter
    preload_modules: list[str]
    layer_path: str
    report: dict = field(default_factory=dict)
    lazy: bool = False  # import nothing of the layer ahead: a run imports what it uses (the lean zygote)
    stdio: tuple = ()  # the children's sys.stdin, stdout and stderr, made once by the zygote (_child_stdio)


def bound_thread_memory() -> None:
    """In the zygote, before any thread or fork: one malloc arena and smaller thread stacks for every
    child (forks keep both; a thread started by user code or by a native library gets them)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not libc.mallopt(M_ARENA_MAX, ARENAS):
        raise OSError("mallopt(M_ARENA_MAX) refused")
    attr = ctypes.create_string_buffer(_PTHREAD_ATTR_BYTES)
    for call in (
        lambda: libc.pthread_attr_init(attr),
        lambda: libc.pthread_attr_setstacksize(attr, ctypes.c_size_t(THREAD_STACK_BYTES)),
        lambda: libc.pthread_setattr_default_np(attr),
    ):
        error = call()
        if error:
            raise OSError(error, f"default thread stack: {os.strerror(error)}")
    libc.pthread_attr_destroy(attr)


def prepare(config: PythonRunnerConfig) -> State:
    bound_thread_memory()
    filters, seccomp_error = allowlist.prepared(config)
    state = State(
        filters=filters,
        required=config.require_seccomp,
        preload_modules=list(config.preload),
        layer_path=config.layer_path,
        lazy=config.lazy,
    )
    state.report = {"seccomp": seccomp_error is None, "seccomp_error": seccomp_error}
    return state


def layer_modules(layer: str) -> list[str]:
    """Every top-level module the layer's distributions provide: the default preload list."""
    import importlib.metadata

    names: set[str] = set()
    for dist in importlib.metadata.distributions(path=[layer]):
        top = dist.read_text("top_level.txt")
        if top:
            names.update(line.strip() for line in top.splitlines())
            continue
        for file in dist.files or []:
            first = file.parts[0]
            if not first.endswith((".dist-info", ".data", ".pth")) and first not in ("..", "bin", "__pycache__"):
                names.add(first.removesuffix(".py"))
    return sorted(n for n in names if n.isidentifier() and not n.startswith("_") and n not in ("test", "tests"))


def warm(state: State) -> dict:
    if state.layer_path:
        sys.path.insert(0, state.layer_path)
    if state.lazy:
        state.preload_modules = []
    elif not state.preload_modules and state.layer_path:
        state.preload_modules = layer_modules(state.layer_path)
    loaded, failed = [], {}
    # Native libraries that start thread pools at load (OpenBLAS under numpy) must not:
    # the zygote forks, and stays single-threaded. Runs do not inherit these variables.
    single = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    saved = {k: os.environ.get(k) for k in single}
    os.environ.update(single)
    try:
        for name in state.preload_modules:
            try:
                importlib.import_module(name)
                loaded.append(name)
            except BaseException as exc:  # noqa: BLE001 - a broken package must not stop start-up
                failed[name] = f"{type(exc).__name__}: {exc}"
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    for name in ("traceback", "linecache", "json", "base64", "datetime", "zoneinfo", "logging"):
        importlib.import_module(name)
    state.stdio = _child_stdio()
    _remember_layer_log_handlers()
    held = sorted({name.partition(".")[0] for name in sys.modules})  # what a run imports at no cost
    return {"preloaded": loaded, "preload_failed": failed, "modules": held}


def _read_exact(fd: int, size: int) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            raise EOFError("the run request was cut short")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _rehearse() -> None:
    """Touch, before the run arrives, what every run touches (the child's memory is
    copy-on-write: the first write to a page costs a copy, better paid while idle)."""
    json.loads('{"code": "print(1)", "timeout": 1.0, "enable_network": false}')
    sink = io.StringIO()
    exec(
        compile("print('warm', 1)", "<warm>", "exec"),
        {"__builtins__": builtins, "print": lambda *a: sink.write(str(a))},
    )
    _HEADER.unpack(_HEADER.pack(1))


def run(state: State, address_space: int, variant: Mapping) -> None:
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__ = state.stdio
    _rehearse()
    (size,) = _HEADER.unpack(_read_exact(0, _HEADER.size))
    request = json.loads(_read_exact(0, size))
    confine.limit_run(address_space + request["memory_limit_mb"] * MIB, int(request["timeout"]) + 1)
    answer_memory_size(request["memory_limit_mb"] * MIB)
    if state.filters:
        state.filters[bool(request["enable_network"])].load()
    elif state.required:
        os.write(2, b"sandbox: seccomp filter unavailable\n")
        os._exit(SETUP_FAILED)
    if request.get("network_refused"):
        refuse_network(request["network_refused"])
    if request.get("tmp_note"):
        note_tmp_elsewhere(request["tmp_note"])
    _exit_reporting(execute(request["code"], request.get("preload", "")))


# Audit events of the calls that would reach the network (or its name service); socket.__new__ only for
# families other than AF_UNIX (socketpair, which asyncio needs, stays).
NETWORK_EVENTS = frozenset(
    {
        "socket.__new__",
        "socket.connect",
        "socket.bind",
        "socket.sendto",
        "socket.sendmsg",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyaddr",
        "socket.getnameinfo",
    }
)
AF_UNIX = 1
# Compiled under a name of its own: a traceback through the hook shows no path of the service.
_HOOK_SOURCE = """
def network_refused(event, args):
    if event in events and not (event == "socket.__new__" and args[1] == unix):
        raise refusal(eperm, message)
"""


def refuse_network(message: str) -> None:
    """A run that asked for network where it gets none (runtimes/jail/policy/network_access.py): its socket calls fail
    with a PermissionError saying why, instead of the filter's bare "Operation not permitted". Only the
    message: the filter loaded for a run without network is what refuses them (ctypes and all)."""
    scope = {"events": NETWORK_EVENTS, "unix": AF_UNIX, "refusal": PermissionError, "eperm": 1, "message": message}
    exec(compile(_HOOK_SOURCE, "<sandbox>", "exec"), scope)
    sys.addaudithook(scope["network_refused"])


# Where /tmp is not the run's own (modes.Mode.tmp_note): what a refused write there adds to the printed traceback,
# and the run's own directory, learnt before the code runs (the code may change TMPDIR or its working directory)
_tmp_note = ""
_own_dir = ""
_TMP_REFUSALS = frozenset({errno.EACCES, errno.EROFS})


def note_tmp_elsewhere(template: str) -> None:
    global _tmp_note, _own_dir
    _own_dir = os.environ.get("TMPDIR") or os.getcwd()
    _tmp_note = template.replace("{tmpdir}", _own_dir)


def _under_literal_tmp(name) -> bool:
    """Whether a file name of an OSError is under /tmp (or /tmp itself), outside the run's own directory."""
    if not isinstance(name, (str, bytes)):
        return False
    try:
        path = os.path.normpath(os.path.join(_own_dir, os.fsdecode(name)))
    except (TypeError, ValueError):
        return False
    own = _own_dir.rstrip("/") + "/"
    return (path == "/tmp" or path.startswith("/tmp/")) and not (path + "/").startswith(own)


def _add_tmp_note(exc: BaseException) -> None:
    """A refused write to a literal /tmp path, where /tmp is not the run's own: the traceback ends saying where
    to write instead (on the exception itself, or one it was raised from or while handling)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if (
            isinstance(exc, OSError)
            and exc.errno in _TMP_REFUSALS
            and (_under_literal_tmp(exc.filename) or _under_literal_tmp(exc.filename2))
        ):
            exc.add_note(_tmp_note)
            return
        exc = exc.__cause__ or exc.__context__


def answer_memory_size(memory_bytes: int) -> None:
    """os.sysconf's SC_PHYS_PAGES and SC_AVPHYS_PAGES: the run's own memory limit.

    glibc asks sysinfo(), which the filter refuses (machine-wide counters), and then
    returns whatever its stack held; a library sizing a cache from it would get a
    random number, and the machine's own is not the run's business.
    """
    real = os.sysconf
    pages = memory_bytes // real("SC_PAGE_SIZE")
    answered = {os.sysconf_names[name] for name in ("SC_PHYS_PAGES", "SC_AVPHYS_PAGES") if name in os.sysconf_names}

    def sysconf(name: str | int, /) -> int:
        number = os.sysconf_names.get(name, name) if isinstance(name, str) else name
        return pages if number in answered else real(name)

    sysconf.__doc__ = real.__doc__
    os.sysconf = sysconf


def _exit_reporting(status: int) -> None:
    """Report the status first: the service answers at once and kills what is left, so the kernel's
    teardown of this copy of the zygote is not on the run's path. The code may have written there
    itself, or closed it: that can only end its own run early, or make the service wait for the exit."""
    try:
        os.write(_REPORT_FD, bytes([status & 0xFF]))
    except OSError:
        pass
    os._exit(status)


# What ends a process by default: terminate or dump core (signal(7)). SIGINT and SIGPIPE are left
# out (Python handles the one and ignores the other, as it does for SIGXFSZ).
_ENDING = {
    signal.SIGHUP, signal.SIGQUIT, signal.SIGILL, signal.SIGTRAP, signal.SIGABRT, signal.SIGBUS,
    signal.SIGFPE, signal.SIGUSR1, signal.SIGSEGV, signal.SIGUSR2, signal.SIGALRM, signal.SIGTERM,
    signal.SIGSTKFLT, signal.SIGXCPU, signal.SIGVTALRM, signal.SIGPROF, signal.SIGIO, signal.SIGPWR,
    signal.SIGSYS, *range(signal.SIGRTMIN, signal.SIGRTMAX + 1),
}  # fmt: skip
# Raised by the kernel on a fault, and then delivered even to a pid 1: a handler would only
# return to the faulting instruction. Aimed at itself on purpose, they go through the wrappers.
_FAULTS = {signal.SIGILL, signal.SIGTRAP, signal.SIGBUS, signal.SIGFPE, signal.SIGSEGV, signal.SIGSYS}


def as_pid_one(state: State) -> None:
    """In the zygote, before it forks children that will each be pid 1 of a PID namespace of their own:
    the signals a run sends itself end it as they would end any process. Installed once here, for every
    child; in any process but a pid 1 (the zygote itself) everything acts as it did without it."""
    for signum in _ENDING - _FAULTS:
        signal.signal(signum, _end_by_signal)
    os.kill, signal.raise_signal, signal.pthread_kill = _os_kill, _signal_raise_signal, _signal_pthread_kill
    os.abort = _os_abort


_kill, _raise_signal, _pthread_kill, _abort = os.kill, signal.raise_signal, signal.pthread_kill, os.abort


def _ends(signum: int) -> bool:
    """Whether signum, sent to itself, would end this process were it not pid 1."""
    if os.getpid() != 1:
        return False
    return signum == signal.SIGKILL or (signum in _ENDING and signal.getsignal(signum) == signal.SIG_DFL)


def _os_kill(pid: int, signum: int) -> None:
    if pid == 1 and _ends(signum):
        _end_by_signal(signum)
    _kill(pid, signum)


def _signal_raise_signal(signum: int) -> None:
    if _ends(signum):
        _end_by_signal(signum)
    _raise_signal(signum)


def _signal_pthread_kill(thread_id: int, signum: int) -> None:
    threading = sys.modules.get("threading")
    if threading is not None and any(t.ident == thread_id for t in threading.enumerate()) and _ends(signum):
        _end_by_signal(signum)
    _pthread_kill(thread_id, signum)


def _os_abort() -> None:
    if os.getpid() == 1:
        _end_by_signal(signal.SIGABRT)
    _abort()


def _end_by_signal(signum: int, _frame=None) -> None:
    """End the run as killed by signum: nothing flushed, as a signal would leave it. (Not pid 1, as the zygote
    is: the signal's default action, as if no handler had been installed.)"""
    if os.getpid() != 1:
        signal.signal(signum, signal.SIG_DFL)
        _kill(os.getpid(), signum)
        return
    try:
        os.write(_REPORT_FD, protocol.killed_by(signum))
    except OSError:
        pass
    os._exit(128 + signum)


def _child_stdio() -> tuple:
    """Streams on fds 0, 1 and 2 for the children, never the zygote's own (which may hold buffered bytes),
    made here once instead of in every child. Each is made while a pipe stands on its fd, as a child's
    pipe will, so that what it learns of its fd when made (no seeking, no terminal) holds there; the
    zygote's own fds are put back, and the zygote never uses these."""
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    read, write = os.pipe()
    try:
        for fd, end in ((0, read), (1, write), (2, write)):
            os.dup2(end, fd)
        streams = (
            io.TextIOWrapper(
                io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8", errors="surrogateescape"
            ),
            io.TextIOWrapper(
                io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8", errors="surrogateescape"
            ),
            io.TextIOWrapper(
                io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                encoding="utf-8",
                errors="backslashreplace",
                line_buffering=True,
            ),
        )
        for stream in streams:
            stream.seekable(), stream.isatty()  # what they learn lazily: learnt now, of a pipe
    finally:
        for fd, copy in zip((0, 1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)
        os.close(read)
        os.close(write)
    return streams


def execute(code: str, preload: str) -> int:
    """Run code as a script would run; return the exit status a script would have."""
    namespace = {"__name__": "__main__", "__builtins__": builtins, "__doc__": None}
    sys.argv = [""]
    status = 0
    try:
        if preload:
            exec(_compile(preload, "<preload>"), namespace)
        exec(_compile(code, "<string>"), namespace)
    except SystemExit as exc:
        status = _exit_status(exc)
    except BaseException as exc:  # noqa: BLE001 - printed like the interpreter would
        _print_exception(exc)
        status = 1
    return _finish(status)


def _print_exception(exc: BaseException) -> None:
    """The traceback the interpreter would print for a script: from the user's first frame on,
    none of the runner's (they would show where the service lives)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    if _tmp_note:
        try:
            _add_tmp_note(exc)
        except Exception:  # noqa: BLE001 - the code's own exception classes: the traceback is printed as it is
            pass
    traceback.print_exception(type(exc), exc, tb)


def _threads_to_wait_for(threading) -> bool:
    """Whether threading's exit has anything to do: a thread the run started (daemon or not, as
    threading._shutdown would tell), or an exit hook registered with threading. With neither it only
    marks the main thread stopped, which nobody is left to see."""
    try:
        return len(threading._active) > 1 or bool(threading._limbo) or bool(threading._threading_atexits)
    except AttributeError:  # another threading than the one this knows: ask it
        return True


# The logging handlers the dependency layer made as the zygote imported it (libraries' NullHandlers, a
# StreamHandler that flushes as it writes): logging's exit hook flushes and closes every handler ever made,
# which for these changes nothing a run could see and costs each run a tenth of a millisecond of page copies.
_layer_log_handlers: tuple = ()


def _remember_layer_log_handlers() -> None:
    global _layer_log_handlers
    logging = sys.modules.get("logging")
    _layer_log_handlers = tuple(getattr(logging, "_handlerList", ()))


def _forget_layer_log_handlers() -> None:
    """Leave the layer's own handlers out of logging's exit hook; the run's are flushed and closed."""
    logging = sys.modules.get("logging")
    known = _layer_log_handlers
    refs = getattr(logging, "_handlerList", None)
    if not known or refs is None or len(refs) < len(known):
        return
    if all(ref is layer_ref for ref, layer_ref in zip(refs[: len(known)], known, strict=True)):
        del refs[: len(known)]


def _compile(source: str, filename: str):
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return compile(source, filename, "exec")


def _exit_status(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _finish(status: int) -> int:
    """What the interpreter does at exit: join threads, run atexit, flush."""
    try:
        threading = sys.modules.get("threading")
        if threading is not None and _threads_to_wait_for(threading):
            threading._shutdown()
        _forget_layer_log_handlers()
        atexit._run_exitfuncs()
    except BaseException as exc:  # noqa: BLE001
        _print_exception(exc)
        status = status or 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed pipe loses nothing we could report
            pass
    return status
