"""Lambda, emulated for tests: the Runtime API a function instance talks to, and the Invoke API boto3 calls.

No package provides the Runtime Interface Emulator and there is no Docker here,
so this speaks the documented protocols on loopback:

- RuntimeAPI: `GET /2018-06-01/runtime/invocation/next` (one invocation at a
  time: a second /next while one is in flight is refused; the invocation's
  tenant id, if any, as `Lambda-Runtime-Aws-Tenant-Id`), `POST
  .../invocation/{id}/response|error` (202; 413 over 6291556 bytes; an unknown or
  finished id is refused), `POST /2018-06-01/runtime/init/error`.
- FunctionInstance: a real `python -m awslambdaric <handler>` process on its own
  RuntimeAPI. An invocation that outlives the function timeout gets "Task timed
  out after N seconds" and the instance is restarted, as Lambda does.
- InvokeAPI: `POST /2015-03-31/functions/{name}/invocations` (RequestResponse),
  forwarding to idle instances; 429 TooManyRequestsException when every instance
  is busy, 413 RequestTooLargeException over 6291456 bytes, 404 for an unknown
  function, `X-Amz-Function-Error: Unhandled` on a function error.
  Tenant isolation (TenancyConfig PER_TENANT, `add_per_tenant`): the caller's
  `X-Amz-Tenant-Id` (boto3's TenantId) picks the environments; each tenant id gets
  environments of its own, started on demand (a cold start) and never used for
  another tenant; idle ones are reclaimed beyond a number kept. As Lambda does,
  an invoke without a tenant id of such a function, or with one of a function
  without tenant isolation, is InvalidParameterValueException (400), and an id
  outside Lambda's format (1-256 of `a-zA-Z0-9._:/=+-@` and space) is a
  ValidationException.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REQUEST_LIMIT = 6_291_456
RESPONSE_LIMIT = 6_291_556
PREFIX = "/2018-06-01/runtime"
REGION = "us-east-1"
ACCOUNT = "000000000000"
TENANT_ID = re.compile(r"[a-zA-Z0-9._:/=+\-@ ]{1,256}")  # botocore's model of Invoke's TenantId


@dataclass
class Invocation:
    payload: bytes
    deadline_ms: int
    tenant_id: str | None = None
    request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    done: threading.Event = field(default_factory=threading.Event)
    kind: str = ""  # "response" | "error" | "timeout" | "crash"
    body: bytes = b""

    def json(self):
        return json.loads(self.body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else every call stalls 40-90 ms on delayed ACKs

    def log_message(self, *args) -> None:
        pass

    def _body(self, limit: int | None = None) -> bytes | None:
        length = int(self.headers.get("Content-Length") or 0)
        if limit is not None and length > limit:
            self.rfile.read(length)
            return None
        return self.rfile.read(length)

    def _answer(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        try:
            self.send_response(status)
        except (BrokenPipeError, ConnectionResetError):
            return
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the caller is gone (a killed runtime, a test shutting down)

    def _error(self, status: int, error_type: str, message: str) -> None:
        body = json.dumps({"errorType": error_type, "errorMessage": message}).encode()
        self._answer(status, body, {"Content-Type": "application/json"})


class RuntimeAPI:
    """The Runtime API of one function instance."""

    def __init__(self, function_arn: str):
        self.function_arn = function_arn
        self.pending: queue.Queue[Invocation] = queue.Queue()
        self.in_flight: Invocation | None = None
        self.lock = threading.Lock()
        self.init_error: dict | None = None
        self.waiting = threading.Event()  # the runtime asked for its first invocation: init is done
        self.refused: list[str] = []  # what was refused, for tests to look at
        self.on_answer = None  # called with (invocation, kind, body) as an answer arrives, before it is taken
        api = self

        class Handler(_Handler):
            def do_GET(self) -> None:
                if self.path == f"{PREFIX}/invocation/next":
                    api._next(self)
                else:
                    self._error(404, "NotFound", self.path)

            def do_POST(self) -> None:
                api._post(self)

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _next(self, request: _Handler) -> None:
        with self.lock:
            if self.in_flight is not None:
                self.refused.append("next while in flight")
                request._error(403, "InvalidStateTransition", "an invocation is in flight")
                return
        self.waiting.set()
        invocation = self.pending.get()
        if invocation is None:  # shutting down
            request._error(410, "Gone", "shutting down")
            return
        with self.lock:
            self.in_flight = invocation
        headers = {
            "Content-Type": "application/json",
            "Lambda-Runtime-Aws-Request-Id": invocation.request_id,
            "Lambda-Runtime-Deadline-Ms": str(invocation.deadline_ms),
            "Lambda-Runtime-Invoked-Function-Arn": self.function_arn,
            "Lambda-Runtime-Trace-Id": f"Root=1-{uuid.uuid4().hex[:8]}-{uuid.uuid4().hex[:24]};Sampled=0",
        }
        if invocation.tenant_id is not None:
            headers["Lambda-Runtime-Aws-Tenant-Id"] = invocation.tenant_id
        request._answer(200, invocation.payload, headers)

    def _post(self, request: _Handler) -> None:
        path = request.path
        if path == f"{PREFIX}/init/error":
            body = request._body() or b"{}"
            self.init_error = json.loads(body)
            request._answer(202, b'{"status":"OK"}', {"Content-Type": "application/json"})
            return
        parts = path.removeprefix(f"{PREFIX}/invocation/").split("/")
        if not path.startswith(f"{PREFIX}/invocation/") or len(parts) != 2 or parts[1] not in ("response", "error"):
            request._body()
            request._error(404, "NotFound", path)
            return
        request_id, kind = parts
        body = request._body(RESPONSE_LIMIT)
        with self.lock:
            invocation = self.in_flight
            if invocation is None or invocation.request_id != request_id:
                self.refused.append(f"{kind} for {request_id}")
                request._error(400, "InvalidRequestID", "no such invocation in flight")
                return
            if body is None:
                request._error(413, "RequestEntityTooLarge", f"response over {RESPONSE_LIMIT} bytes")
                self._finish(invocation, "error", b'{"errorType": "Function.ResponseSizeTooLarge"}')
                return
            if self.on_answer is not None:
                self.on_answer(invocation, kind, body)
            self._finish(invocation, kind, body)
        request._answer(202, b'{"status":"OK"}', {"Content-Type": "application/json"})

    def _finish(self, invocation: Invocation, kind: str, body: bytes) -> None:
        self.in_flight = None
        invocation.kind, invocation.body = kind, body
        invocation.done.set()

    def submit(self, payload: bytes, timeout: float, tenant_id: str | None = None) -> Invocation:
        invocation = Invocation(payload, int((time.time() + timeout) * 1000), tenant_id)
        self.pending.put(invocation)
        return invocation

    def abandon(self) -> None:
        """The instance died or was killed: whatever was in flight is over."""
        with self.lock:
            self.in_flight = None

    def close(self) -> None:
        self.pending.put(None)
        self.server.shutdown()
        self.server.server_close()


class FunctionInstance:
    """A real awslambdaric process serving one function, on a RuntimeAPI of its own."""

    def __init__(
        self,
        handler: str,
        env: dict[str, str],
        name: str = "sandlot-test",
        timeout: float = 30,
        python: str = sys.executable,
        prefix: tuple[str, ...] = (),
        cwd: str | None = None,
    ):
        self.handler = handler
        self.name = name
        self.timeout = timeout
        self.env = env
        self.python = python
        self.prefix = prefix
        self.cwd = cwd
        self.arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}"
        self.api: RuntimeAPI | None = None
        self.process: subprocess.Popen | None = None
        self.busy = False
        self.init_seconds = 0.0
        self.log_path = ""
        self.final_output = ""
        self.tmp = ""  # the instance's temp dir (its TMPDIR), removed when it stops for good
        self.tenant_id: str | None = None  # under tenant isolation: the tenant this environment belongs to
        self.served = 0  # invocations answered

    def start(self, wait: bool = True, init_timeout: float = 60) -> FunctionInstance:
        self.api = RuntimeAPI(self.arn)
        env = {
            **self.env,
            "AWS_LAMBDA_RUNTIME_API": self.api.address,
            "AWS_LAMBDA_FUNCTION_NAME": self.name,
            "AWS_LAMBDA_FUNCTION_TIMEOUT": str(int(self.timeout)),
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "LAMBDA_TASK_ROOT": self.cwd or os.getcwd(),
        }
        fd, self.log_path = _log_file(self.name)
        started = time.monotonic()
        self.process = subprocess.Popen(
            [*self.prefix, self.python, "-m", "awslambdaric", self.handler],
            env=env,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.STDOUT,
        )
        os.close(fd)
        if wait:
            self.wait_init(init_timeout)
            self.init_seconds = time.monotonic() - started
        return self

    def wait_init(self, timeout: float) -> None:
        """Until the runtime asks for its first invocation (init done), posts an init error, or exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.api.waiting.wait(0.02):
                return
            if self.api.init_error is not None or self.process.poll() is not None:
                return
        raise TimeoutError(f"{self.name} did not finish init in {timeout}s:\n{self.output()}")

    @property
    def ready(self) -> bool:
        return self.api is not None and self.api.waiting.is_set() and self.process.poll() is None

    def invoke(self, event: object | bytes, tenant_id: str | None = None) -> Invocation:
        """One invocation, as Lambda would run it on this instance (restarted after a timeout or crash).

        tenant_id: what the Runtime API hands the function as the invocation's tenant (Lambda only ever
        hands an environment its own tenant's; a test may hand another, as a misdeployment would)."""
        payload = event if isinstance(event, bytes) else json.dumps(event).encode()
        self.served += 1
        invocation = self.api.submit(payload, self.timeout, tenant_id)
        deadline = time.monotonic() + self.timeout
        while not invocation.done.wait(0.05):
            if time.monotonic() > deadline:
                invocation.kind = "timeout"
                message = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} Task timed out after {self.timeout:.2f} seconds"
                invocation.body = json.dumps({"errorMessage": message}).encode()
                self.restart()
                return invocation
            if self.process.poll() is not None:
                invocation.kind = "crash"
                invocation.body = json.dumps(
                    {"errorType": "Runtime.ExitError", "errorMessage": f"exit status {self.process.returncode}"}
                ).encode()
                self.restart()
                return invocation
        return invocation

    def restart(self) -> None:
        self.stop(for_good=False)
        self.start()

    def output(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return self.final_output  # stopped: what its last log said

    def stop(self, for_good: bool = True) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.api is not None:
            self.api.close()
        if self.log_path:  # a restart logs to a new file: keep what this one said, leave no file behind
            self.final_output = self.output()
            with contextlib.suppress(OSError):
                os.unlink(self.log_path)
        if for_good and self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)  # what a killed runtime could not remove itself


def _log_file(name: str) -> tuple[int, str]:
    path = f"/tmp/sandlot-lambda-{name}-{uuid.uuid4().hex[:8]}.log"
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), path


@dataclass
class _Function:
    """A function as the Invoke API sees it: fixed instances, or environments per tenant started on demand."""

    name: str
    instances: list[FunctionInstance] = field(default_factory=list)
    start: Callable[[str], FunctionInstance] | None = None  # per tenant: starts an environment for a tenant id
    concurrency: int = 1  # environments busy at once, across tenants (reserved concurrency)
    keep: int = 4  # idle environments kept; the least recently used beyond that are reclaimed
    environments: dict[str, list[FunctionInstance]] = field(default_factory=dict)
    starting: int = 0
    last_used: dict[int, float] = field(default_factory=dict)  # id(instance) -> when it last finished

    @property
    def per_tenant(self) -> bool:
        return self.start is not None

    def busy(self) -> int:
        return self.starting + sum(i.busy for envs in self.environments.values() for i in envs)


class InvokeAPI:
    """Lambda's Invoke API on loopback, for boto3 (`endpoint_url`), forwarding to function instances."""

    def __init__(self):
        self.functions: dict[str, _Function] = {}
        self.lock = threading.Lock()
        self.invocations = 0
        self.calls: list[tuple[str, str | None, int]] = []  # (function, tenant id, pid of the environment)
        self.stopping: list[threading.Thread] = []  # reclaimed environments being stopped
        api = self

        class Handler(_Handler):
            def do_POST(self) -> None:
                api._invoke(self)

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, name: str, instances: list[FunctionInstance]) -> None:
        """A function without tenant isolation, served by these instances (the caller starts and stops them)."""
        self.functions[name] = _Function(name, instances=instances, concurrency=len(instances))

    def add_per_tenant(
        self, name: str, start: Callable[[str], FunctionInstance], concurrency: int = 1, keep: int = 4
    ) -> None:
        """A function deployed with TenancyConfig PER_TENANT: `start(tenant_id)` starts an environment (and
        waits for its init); the Invoke API stops the environments it started."""
        self.functions[name] = _Function(name, start=start, concurrency=concurrency, keep=keep)

    def environments(self, name: str) -> dict[str, list[FunctionInstance]]:
        """A per-tenant function's live environments by tenant id."""
        with self.lock:
            return {tenant: list(envs) for tenant, envs in self.functions[name].environments.items()}

    def _lookup(self, name: str) -> _Function | None:
        name = urllib.parse.unquote(name)
        if name.startswith("arn:"):
            name = name.split(":function:", 1)[-1].split(":")[0]
        return self.functions.get(name)

    def _aws_error(self, request: _Handler, status: int, code: str, message: str) -> None:
        body = json.dumps({"Type": "User", "message": message}).encode()
        request._answer(status, body, {"Content-Type": "application/json", "x-amzn-ErrorType": code})

    def _invoke(self, request: _Handler) -> None:
        path = urllib.parse.urlparse(request.path).path
        parts = path.split("/")
        if len(parts) != 5 or parts[1:3] != ["2015-03-31", "functions"] or parts[4] != "invocations":
            request._body()
            self._aws_error(request, 404, "UnknownOperationException", path)
            return
        body = request._body(REQUEST_LIMIT)
        if body is None:
            self._aws_error(
                request, 413, "RequestTooLargeException", f"Request must be smaller than {REQUEST_LIMIT} bytes"
            )
            return
        function = self._lookup(parts[3])
        if function is None:
            self._aws_error(request, 404, "ResourceNotFoundException", f"Function not found: {parts[3]}")
            return
        tenant = request.headers.get("X-Amz-Tenant-Id")
        if (tenant is None) == function.per_tenant:
            self._aws_error(
                request,
                400,
                "InvalidParameterValueException",
                "Tenant ID configuration not specified or passed to a function when tenant isolation is not enabled.",
            )
            return
        if tenant is not None and not TENANT_ID.fullmatch(tenant):
            self._aws_error(
                request, 400, "ValidationException", f"1 validation error detected: Value '{tenant}' at 'tenantId'"
            )
            return
        try:
            instance = self._take(function, tenant)
        except Exception as exc:  # noqa: BLE001 - an environment that could not even start
            self._aws_error(request, 500, "ServiceException", f"could not start an environment: {exc}")
            return
        if instance is None:
            self._aws_error(request, 429, "TooManyRequestsException", "Rate Exceeded.")
            return
        try:
            if not instance.ready:  # an environment whose init failed
                invocation = Invocation(body, 0, tenant, kind="error")
                invocation.body = json.dumps(instance.api.init_error or {"errorType": "Runtime.ExitError"}).encode()
            else:
                invocation = instance.invoke(body, tenant)
            self.calls.append((function.name, tenant, instance.process.pid))
        finally:
            with self.lock:
                instance.busy = False
                function.last_used[id(instance)] = time.monotonic()
            self._reclaim(function)
        headers = {"Content-Type": "application/json", "X-Amz-Executed-Version": "$LATEST"}
        if invocation.kind != "response":
            headers["X-Amz-Function-Error"] = "Unhandled"
        request._answer(200, invocation.body, headers)

    def _take(self, function: _Function, tenant: str | None) -> FunctionInstance | None:
        """An idle instance (of the tenant's environments), marked busy; a new environment for the tenant when
        none is idle and the function's concurrency allows; None when it does not (429)."""
        with self.lock:
            pool = function.environments.setdefault(tenant, []) if function.per_tenant else function.instances
            idle = next((i for i in pool if not i.busy), None)
            if idle is not None:
                idle.busy = True
                self.invocations += 1
                return idle
            if not function.per_tenant or function.busy() >= function.concurrency:
                return None
            function.starting += 1
            self.invocations += 1
        try:
            instance = function.start(tenant)  # the cold start: this invocation waits for the init
            instance.tenant_id = tenant
            instance.busy = True
        finally:
            with self.lock:
                function.starting -= 1
        with self.lock:
            function.environments.setdefault(tenant, []).append(instance)
        return instance

    def _reclaim(self, function: _Function) -> None:
        """Stop environments that cannot serve, and the least recently used idle ones beyond `keep` (in the
        background, as Lambda reclaims them)."""
        if not function.per_tenant:
            return
        with self.lock:
            idle = [
                (function.last_used.get(id(i), 0.0), tenant, i)
                for tenant, envs in function.environments.items()
                for i in envs
                if not i.busy
            ]
            idle.sort(key=lambda entry: entry[0])
            dead = [entry for entry in idle if not entry[2].ready]  # its init failed, or it exited: never reused
            alive = [entry for entry in idle if entry[2].ready]
            retired = dead + alive[: max(0, len(alive) - function.keep)]
            for _, tenant, instance in retired:
                function.environments[tenant].remove(instance)
                if not function.environments[tenant]:
                    del function.environments[tenant]
        for _, _, instance in retired:
            stopping = threading.Thread(target=instance.stop, daemon=True)
            stopping.start()
            self.stopping.append(stopping)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        for stopping in self.stopping:
            stopping.join()
        for function in self.functions.values():
            if function.per_tenant:
                for envs in function.environments.values():
                    for instance in envs:
                        instance.stop()
                function.environments.clear()
