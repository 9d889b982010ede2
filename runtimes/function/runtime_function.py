"""A language runtime as a Lambda function, bootstrapped by awslambdaric.

    python -m awslambdaric runtimes.<language>.lambda_function.handler

Module import is Lambda's init phase. The role's credentials are gone before it
begins (runtimes/function/early.py: in the image, the ENTRYPOINT's env(1) drops them
before the interpreter starts; a process started otherwise re-executes itself
from the venv's .pth hook), and the platform probe runs in a forked child beside
the imports, from that hook as the interpreter starts, and so does the first zygote's interpreter, which
imports its modules meanwhile and waits for its config (runtimes/jail/zygote_start.py). The
cold path imports no pydantic: the settings are read by runtimes/function/environment.py,
the event by payload.read_request, the result is a plain dataclass. Then it reads the probed record (the
shared protections record, which decides the mode), starts the zygote (a
separately exec'ed process with a clean environment: the one started ahead,
given its config now) with the layer baked into the image, and prepares the child for the first run, so that the first
invocation finds it ready. That zygote is the first run's (the serial schedule's
first-run step, jail/service/serial.py): it does nothing only later runs need (Python:
no preload of the layer; Node: the snapshot baked into the image instead of a
build), and is replaced by the usual one once the first run is over. What goes
wrong there raises InitFailure, which awslambdaric reports through the Runtime
API's init error.

The handler takes a run request and returns the run result (the local seam's
dicts), or `{"action": "probe"}` / `{"action": "dependencies"}`. Errors travel
as the function's error: errorType `Unavailable` (a -500 envelope with its
message) or `InvalidRequest` (a -400 one). Runs go through the runtime's one run
path with the serial schedule (runtimes/jail/service/serial.py): the result is returned
only once nothing of the run can execute again.

The rest (reaping, the sweep's confirmation, removing what the run left,
preparing the next child) happens once awslambdaric has posted the result,
before it asks for the next invocation (`between_invocations`): it never delays
the answer, nothing of a run exists when the next event is fetched, and it is
done before Lambda freezes the instance (an instance waiting for its next
invocation gets no CPU, so work left for then would only happen once the next
invocation is already waiting for it).

Tenancy (the function is deployed with TenancyConfig PER_TENANT; the tenant id
of an invocation is awslambdaric's `context.tenant_id`): where the seccomp
filter is in force it keeps tenants apart, and any invocation is served. Where
it cannot be installed, Lambda's tenant isolation takes its place, so with
RequireSeccomp (the default) only invocations carrying a tenant id of their own
are served (not the API's shared one, SHARED_TENANT, which means the caller
counts on the filter): the environment is then that tenant's alone. Either way
an environment pins the first tenant id it serves and refuses any other, which
only a misdeployed function would hand it. The probe reports which of these
the function relies on (`tenancy`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable

from runtimes.config import RuntimeConfig
from runtimes.function import early
from runtimes.function.early import drop_credentials
from runtimes.function.environment import ConfigError, function_environment
from runtimes.jail import zygote_start
from runtimes.jail.service.runtime import JailedRuntime
from runtimes.jail.service.sweep import StrayProcesses
from runtimes.linux import tempdirs
from runtimes.linux.protections import platform_protections
from runtimes.payload import (
    LAMBDA_REQUEST_LIMIT,
    SHARED_TENANT,
    InvalidRequest,
    RunResult,
    TenantRefused,
    Unavailable,
    fit_result,
    read_request,
)

log = logging.getLogger("sandlot.function")
logging.getLogger("sandlot").setLevel(logging.INFO)  # the init report goes to the function's log

DEADLINE_MARGIN = 1.0  # seconds kept back from Lambda's deadline to return a timed-out run's result


def _process_age() -> float:
    """Seconds since this process was started (an exec, such as drop_credentials', keeps the start), or NaN."""
    try:
        with open("/proc/self/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as f:
            return float(f.read().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return float("nan")


class InitFailure(RuntimeError):
    """The function cannot serve at all; the message says what the operator must change."""


def transport_escapes_non_ascii() -> bool:
    """Whether awslambdaric will post the result with non-ASCII as \\uXXXX (it depends on the platform)."""
    try:
        from awslambdaric.lambda_runtime_marshaller import Encoder
    except ImportError:
        return True
    return bool(Encoder().ensure_ascii)


_between: list[Callable[[], None]] = []


def between_invocations(callback: Callable[[], None]) -> bool:
    """Call `callback` each time awslambdaric has answered an invocation (posted its result or error),
    before it asks for the next one, and once before the first. False if this awslambdaric has no such step.

    awslambdaric's loop is `wait_next_invocation()` then `handle_event_request()` (handler, then the post),
    so the start of `wait_next_invocation` is where the last answer has been posted.
    """
    try:
        from awslambdaric.lambda_runtime_client import LambdaRuntimeClient
    except ImportError:
        return False
    wait = getattr(LambdaRuntimeClient, "wait_next_invocation", None)
    if wait is None:
        return False
    if not _between:

        @functools.wraps(wait)
        def wait_next_invocation(client, *args, **kwargs):
            for between in _between:
                between()
            return wait(client, *args, **kwargs)

        LambdaRuntimeClient.wait_next_invocation = wait_next_invocation
    _between.append(callback)
    return True


class RuntimeFunction:
    """One runtime, started at import, serving one invocation at a time."""

    def __init__(self, runtime_class: type[JailedRuntime], list_layer: Callable[[RuntimeConfig], list[dict]]):
        drop_credentials()
        self.imports_seconds = time.monotonic() - early.imports_started  # the handler module's (nan: not known)
        try:
            self.settings = function_environment()
        except ConfigError as exc:
            raise InitFailure(f"{exc} (check the function's environment in template.yaml)") from exc
        self.config = self.settings.runtime_config()
        # RequireSeccomp here means: the filter, or tenant isolation in its place (checked per invocation, admit)
        self.require_seccomp = self.config.require_seccomp
        probing = time.monotonic()
        early.record()  # the probe started before the imports (early.first_steps), if it was
        if not platform_protections().seccomp:  # probed once per process; the runtime's start reads the same
            self.config.require_seccomp = False
        self.probe_seconds = time.monotonic() - probing  # waited for the probe (early: it ran beside the imports)
        self.tenant: str | None = None  # the first tenant id served: the only one this environment serves
        self.runtime = runtime_class(self.config)
        self.list_layer = list_layer
        self.ascii_only = transport_escapes_non_ascii()
        self.between_hooked = False  # awslambdaric calls _between after each answer
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="sandlot-runtime", daemon=True).start()
        self._stop_on_sigterm()
        try:
            self._call(self._init())
        except BaseException:
            zygote_start.discard_ahead()  # an init that fails before its runtime took it (no node, no layer)
            raise

    def _stop_on_sigterm(self) -> None:
        """Lambda ends an instance with SIGTERM (then SIGKILL): stop the runtime first, so that what it holds
        goes with it (its zygote and children, and where it runs as root its uid block and egress rules).
        awslambdaric's main thread may be blocked in C waiting for the next invocation, where no Python
        signal handler runs: the signal reaches the runtime's loop through the wakeup fd instead."""
        if threading.current_thread() is not threading.main_thread():
            return  # imported off the main thread (not by awslambdaric): signals are not ours to take
        read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.signal(signal.SIGTERM, lambda *_: None)  # caught, so that it is written to the wakeup fd
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        self.loop.call_soon_threadsafe(self.loop.add_reader, read_fd, self._on_signal, read_fd)

    def _on_signal(self, read_fd: int) -> None:
        try:
            received = os.read(read_fd, 64)
        except BlockingIOError:
            return
        if signal.SIGTERM in received:
            log.info("SIGTERM: stopping the %s runtime", self.runtime.language)
            self.loop.remove_reader(read_fd)
            self.loop.create_task(self._shutdown())

    async def _shutdown(self) -> None:
        try:
            await self.runtime.stop()
        except BaseException:  # noqa: BLE001 - ending anyway
            log.exception("while stopping the runtime")
        finally:
            tempdirs.remove_own()  # its data dir when SANDLOT_DATA_DIR is unset (no atexit after _exit)
            os._exit(0)

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def _between(self) -> None:
        """awslambdaric posted the last answer and is about to ask for the next invocation."""
        try:
            self._call(self.runtime.between())
        except Exception:  # noqa: BLE001 - the next run forks its child itself then
            log.exception("could not prepare the next run")

    async def _init(self) -> None:
        runtime = self.runtime
        missing = runtime.missing()
        if missing:
            raise InitFailure(f"{missing}: the {runtime.language} image must install it")
        for layer in (self.config.python_layer, self.config.nodejs_layer):
            if layer and not os.access(layer, os.R_OK | os.X_OK):
                raise InitFailure(f"the dependency layer {layer} is not readable: rebuild the image")
        started = time.monotonic()
        await runtime.start()
        ahead = "used" if runtime.zygote_started_ahead else "unused" if zygote_start.discard_ahead() else "none"
        platform = runtime.platform
        if not runtime.refused and not runtime.ready:
            reason = runtime.error or "unknown"
            await runtime.stop()
            if platform is None or platform.seccomp:
                raise InitFailure(f"the {runtime.language} jail could not start here: {reason}")
            # a platform that refuses seccomp (some kill the caller with SIGSYS) where the jail cannot start
            # without it either: still answer the probe, and refuse runs saying why
            runtime.refused = f"the seccomp filter cannot be installed here ({self._seccomp_error()}) and the jail "
            runtime.refused += f"could not start without it: {reason}"
        # the function still answers the probe where runs are refused, saying why
        self.between_hooked = between_invocations(self._between)
        log.info(
            "%s runtime function ready in %.3f s (zygote, first child); init %.3f s since the process started "
            "(platform probe %.3f s waited for; the function's imports %.3f s; zygote started ahead: %s); "
            "protections in force: %s; tenants kept apart by: %s; platform: %s%s",
            runtime.language,
            time.monotonic() - started,
            _process_age(),
            self.probe_seconds,
            self.imports_seconds,
            ahead,
            runtime.protections(),
            self.boundary(),
            platform.to_dict() if platform else None,
            f"; runs refused: {runtime.refused}" if runtime.refused else "",
        )

    # ---- the handler ------------------------------------------------------------

    def handler(self, event: object, context: object = None) -> dict:
        if isinstance(event, dict) and "action" in event:
            return self.action(event)
        request = read_request(event, self.settings.ENABLE_NETWORK)  # no pydantic for a plain one (payload.py)
        runtime = self.runtime
        if request.language != runtime.language:
            raise InvalidRequest(f"this function runs {runtime.language} code, not {request.language}")
        if runtime.refused:
            raise Unavailable(runtime.refused)
        self.admit(getattr(context, "tenant_id", None))
        if not request.enable_network and not runtime.filter_in_force:
            raise Unavailable("enable_network false cannot be enforced here: no seccomp filter can be installed")
        timeout = self.config.clamp_timeout(request.timeout)
        remaining = getattr(context, "get_remaining_time_in_millis", None)
        if remaining is not None:
            timeout = max(0.001, min(timeout, remaining() / 1000 - DEADLINE_MARGIN))
        try:
            result = self._call(self._run(request, timeout))
        except StrayProcesses as exc:
            runtime.refused = f"this instance could not clean up after a run: {exc}"
            raise Unavailable(runtime.refused) from exc
        except Unavailable as exc:
            raise Unavailable(str(exc)) from exc  # one errorType for the invoker, whatever raised it
        return fit_result(result, LAMBDA_REQUEST_LIMIT, self.ascii_only).to_wire()

    async def _run(self, request, timeout: float) -> RunResult:
        result = await self.runtime.run(request, max_seconds=timeout)
        if not self.between_hooked:
            await self.runtime.between()  # no later step to do it in: before the answer, then
        return result

    # ---- tenancy ----------------------------------------------------------------

    def boundary(self) -> str:
        """What keeps this environment's runs from other tenants: `seccomp`, `tenant isolation` (no filter:
        Lambda's environments per tenant id), or `none` (no filter and RequireSeccomp=false)."""
        if self.runtime.filter_in_force:
            return "seccomp"
        return "tenant isolation" if self.require_seccomp else "none"

    def admit(self, tenant: str | None) -> None:
        """Raise TenantRefused unless this environment may run code for `tenant` (context.tenant_id); the first
        tenant id admitted is the only one admitted from then on."""
        boundary = self.boundary()
        if boundary != "seccomp" and tenant == SHARED_TENANT:
            raise TenantRefused(
                f"the seccomp filter cannot be installed here ({self._seccomp_error()}): the tenant id "
                f"{SHARED_TENANT!r} is the one the API shares between its runs where it counts on the filter; "
                "runs here need a tenant id of their own (the API asks the probe again and uses one per run)"
            )
        if boundary == "tenant isolation" and not tenant:
            raise TenantRefused(
                f"the seccomp filter cannot be installed here ({self._seccomp_error()}) and this invocation carries "
                "no tenant id: without the filter, runs are served only under Lambda's tenant isolation, each "
                "tenant in environments of its own (deploy the function with TenancyConfig PER_TENANT and "
                "invoke it with a TenantId, as the API does: SANDLOT_LAMBDA_TENANCY), or with RequireSeccomp=false"
            )
        if tenant:
            if self.tenant is None:
                self.tenant = tenant
                log.info("this environment serves tenant %r, and only that tenant, from now on", tenant)
            elif tenant != self.tenant:
                raise TenantRefused(
                    f"this environment serves tenant {self.tenant!r} only and refuses tenant {tenant!r}: Lambda "
                    "hands an environment one tenant's invocations only; is the function deployed with "
                    "TenancyConfig PER_TENANT?"
                )

    def _seccomp_error(self) -> str:
        platform = self.runtime.platform
        found = platform.errors.get("seccomp", "") if platform is not None else ""
        return found or self.runtime.report.get("seccomp_error") or "refused by the platform"

    def action(self, event: dict) -> dict:
        name = event.get("action")
        runtime = self.runtime
        if name == "probe":
            return {
                "language": runtime.language,
                "platform": runtime.platform.to_dict() if runtime.platform else None,
                "protections": runtime.protections(),
                "require_seccomp": self.require_seccomp,
                "seccomp_error": runtime.report.get("seccomp_error", ""),
                "refused": runtime.refused,
                "one_run_at_a_time": self.config.one_run_at_a_time,
                "tenancy": {
                    "boundary": self.boundary(),
                    "requires_tenant_id": self.boundary() == "tenant isolation",
                    "shared_tenant": self.boundary() == "seccomp",  # whether SHARED_TENANT is served
                    "tenant": self.tenant,
                },
            }
        if name == "dependencies":
            return {"dependencies": self.list_layer(self.config)}
        raise InvalidRequest(f"unknown action {name!r} (known: probe, dependencies)")
