"""The LambdaInvoker: a run request as the payload of the language's runtime function (boto3, RequestResponse).

Region, credentials and endpoint come from boto3's own configuration
(AWS_REGION, AWS_ENDPOINT_URL_LAMBDA, a role...), so the same service can front
real Lambda or an emulation. One client, reused. Its read timeout is above the
function's timeout and it makes one attempt only: a slow run is never silently
executed twice.

How Lambda's answers map (the run path turns the errors into envelopes):
- a run result: read into a RunResult (its shape is the contract's, runtimes/payload.py);
- throttling (TooManyRequestsException, 429): Throttled -> the 503 envelope;
- a request over Lambda's payload limit: InvalidRequest -> -400;
- the function's own errors: errorType `Unavailable`, `TenantRefused` and
  `InvalidRequest` carry the runtime's answer; "Task timed out", any other function
  error, a payload that is not a run result, or no answer at all: Unavailable ->
  -500 saying which.

Every invoke carries a tenant id (the runtime functions are deployed with
Lambda's tenant isolation), chosen by SANDLOT_LAMBDA_TENANCY (handler/tenancy.py).
Under `auto` each function's probe is asked once (at start, or at the first run
when that failed) whether its seccomp filter is in force; a run the function
refuses for its tenant id (TenantRefused: nothing of it ran) makes the invoker
ask again, and if the filter is gone the run is sent once more with an id of
its own. Probes and layer listings run no code: they carry the shared id.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time

from pydantic import ValidationError

from handler.logs import current_request
from handler.tenancy import SHARED_TENANT, TenancyPolicy, per_run_id, request_tenant, tenant_id
from layers.store import LayerBuildError
from runtimes.languages import LANGUAGES, WIRE_NAMES, by_wire_name
from runtimes.payload import (
    LAMBDA_REQUEST_LIMIT,
    NETWORK_DISABLED,
    InvalidRequest,
    RunRequest,
    RunResult,
    TenantRefused,
    Throttled,
    Unavailable,
    describe,
)

log = logging.getLogger("sandlot.lambda")
READ_TIMEOUT_MARGIN = 10.0  # seconds over the function's timeout before the client gives up
PROBE_RETRY = 30.0  # seconds before a probe that failed is tried again (runs get ids of their own meanwhile)


def is_error_payload(payload: object) -> bool:
    """A function error's payload (awslambdaric's errorType and errorMessage), which no answer of a runtime
    function has: SAM local 1.170 hands such payloads on without FunctionError when they carry a requestId."""
    return isinstance(payload, dict) and "errorType" in payload and "errorMessage" in payload


def function_error(name: str, payload: object) -> Exception:
    """What a function error (FunctionError set on the response) means for the run."""
    if not isinstance(payload, dict):
        return Unavailable(f"the {name} function failed without saying why")
    kind = str(payload.get("errorType", ""))
    message = str(payload.get("errorMessage", ""))
    if kind == "Unavailable":
        return Unavailable(message)
    if kind == "TenantRefused":
        return TenantRefused(message)
    if kind == "InvalidRequest":
        return InvalidRequest(message, http_status=200 if message == NETWORK_DISABLED else 400)
    if "Task timed out" in message:
        return Unavailable(f"the {name} function timed out: {message}")
    return Unavailable(f"the {name} function failed: {kind or 'error'}: {message}")


def _setting_of(language: str) -> str:
    """The setting that names a language's runtime function."""
    try:
        return by_wire_name(language).lambda_function_setting
    except KeyError:
        return f"SANDLOT_LAMBDA_{language.upper()}_FUNCTION"


class LambdaInvoker:
    """Runs on Lambda: one runtime function per language."""

    def __init__(
        self,
        functions: dict[str, str],
        function_timeout: float,
        max_connections: int = 10,
        client=None,
        probe_at_start: bool = True,
        tenancy: TenancyPolicy | None = None,
    ):
        self.functions = {language: name for language, name in functions.items() if name}
        self.tenancy = tenancy or TenancyPolicy("auto")
        self._probed_at: dict[str, float] = {}  # when each function's probe was last asked (answered or not)
        self._probe_locks: dict[str, asyncio.Lock] = {}
        self.function_timeout = function_timeout
        self.read_timeout = function_timeout + READ_TIMEOUT_MARGIN
        self.max_connections = max_connections
        self._client = client
        self.platform: dict[str, dict] = {}  # each function's protections record, asked at start
        self._probing = probe_at_start  # not ready until start() has asked each function for its record

    @classmethod
    def from_settings(cls, settings, probe_at_start: bool = True) -> LambdaInvoker:
        return cls(
            {language.wire_name: getattr(settings, language.lambda_function_setting) for language in LANGUAGES},
            settings.lambda_function_timeout,
            max_connections=max(10, settings.MAX_WORKERS),
            probe_at_start=probe_at_start,
            tenancy=settings.lambda_tenancy,
        )

    @property
    def client(self):
        if self._client is None:
            import boto3
            from botocore.config import Config

            config = Config(
                connect_timeout=5,
                read_timeout=self.read_timeout,
                retries={"total_max_attempts": 1, "mode": "standard"},
                max_pool_connections=self.max_connections,
                # the call's shape is ours and fixed (a name, bytes): checking it against the model costs
                # about as much as signing it, on every run
                parameter_validation=False,
            )
            # SANDLOT_LAMBDA_ENDPOINT_URL (template.yaml declares it, empty): another Invoke API, such as
            # `sam local start-lambda`; empty or unset, boto3's own (AWS_ENDPOINT_URL_LAMBDA, else Lambda's)
            endpoint = os.environ.get("SANDLOT_LAMBDA_ENDPOINT_URL") or None
            self._client = boto3.client("lambda", config=config, endpoint_url=endpoint)
        return self._client

    def connect(self) -> None:
        """Create the client now (at init, where boto3 reads its configuration)."""
        _ = self.client

    # ---- Invoker --------------------------------------------------------------

    async def start(self) -> None:
        """Create the client and ask each function for its protections record (for the log and health)."""
        await asyncio.to_thread(self.connect)
        self._probing = True  # a run must not meet an instance busy with a probe
        try:
            for language in self.functions:
                await self._probe(language)
        finally:
            self._probing = False

    async def stop(self) -> None:
        pass

    async def invoke(self, request: RunRequest) -> RunResult:
        name = self._function(request.language)
        payload = request.to_payload()
        tenant = await self._tenant_for(request.language)
        try:
            answer = await asyncio.to_thread(self._invoke, name, payload, tenant)
        except TenantRefused:
            if tenant != SHARED_TENANT:
                raise
            # the function no longer has its filter (a new deployment, another platform): nothing of the run
            # ran; ask again, and send it with an id of its own if the answer says so
            await self._probe(request.language)
            tenant = await self._tenant_for(request.language)
            if tenant == SHARED_TENANT:
                raise
            log.warning("the %s function has no seccomp filter any more: runs get tenant ids of their own", name)
            answer = await asyncio.to_thread(self._invoke, name, payload, tenant)
        try:
            return RunResult.model_validate(answer)
        except ValidationError as exc:
            problem = describe(exc.errors())
            raise Unavailable(f"malformed payload from the {name} function: not a run result ({problem})") from exc

    def ready(self) -> bool:
        return bool(self.functions) and not self._probing

    def status(self) -> dict:
        status = {}
        for language in WIRE_NAMES:
            name = self.functions.get(language, "")
            probe = self.platform.get(language, {})
            status[language] = {
                "ready": bool(name) and not probe.get("refused"),
                "function": name,
                "error": "" if name else f"no function configured ({_setting_of(language)})",
                "protections": probe.get("protections"),
                "platform": probe.get("platform"),
                "refused": probe.get("refused", ""),
                "tenancy": {
                    "policy": self.tenancy.describe(),
                    "ids": self._ids(language),
                    "function": probe.get("tenancy"),  # what the function relies on, as its probe said
                },
            }
        return status

    # ---- layer administration: the layer is baked into each function's image ------------

    async def dependencies(self, language: str) -> list[dict[str, str]]:
        answer = await asyncio.to_thread(
            self._invoke, self._function(language), {"action": "dependencies"}, SHARED_TENANT
        )
        if not isinstance(answer, dict) or not isinstance(answer.get("dependencies"), list):
            raise Unavailable("malformed payload from the runtime function: no dependency list")
        return answer["dependencies"]

    async def update_dependencies(self, language: str) -> None:
        raise LayerBuildError(
            f"the {language} dependency layer is baked into the runtime function's image: "
            "change the requirements, rebuild the image and deploy it (sam build && sam deploy)"
        )

    # ---- tenancy --------------------------------------------------------------------

    def _shares(self, language: str) -> bool:
        """Whether the function said (its probe) that it serves the shared tenant id: its filter is in force."""
        tenancy = self.platform.get(language, {}).get("tenancy")
        return isinstance(tenancy, dict) and tenancy.get("shared_tenant") is True

    def _ids(self, language: str) -> str:
        if self.tenancy.kind == "header":
            return f"per tenant ({self.tenancy.header}), else per run"
        if self.tenancy.kind == "auto" and self._shares(language):
            return f"shared ({SHARED_TENANT!r}): the function's seccomp filter is in force"
        return "per run"

    async def _probe(self, language: str) -> None:
        """Ask the function for its record (protections, platform, tenancy); keep the last answer."""
        lock = self._probe_locks.setdefault(language, asyncio.Lock())
        asked = self._probed_at.get(language)
        async with lock:
            if self._probed_at.get(language) != asked:
                return  # asked meanwhile, by a run that came at the same time
            self._probed_at[language] = time.monotonic()
            name = self.functions[language]
            try:
                answer = await asyncio.to_thread(self._invoke, name, {"action": "probe"}, SHARED_TENANT)
            except (Unavailable, Throttled, InvalidRequest) as exc:
                log.warning("could not probe the %s function %s: %s", language, name, exc)
                self.platform.pop(language, None)
                return
            self.platform[language] = answer if isinstance(answer, dict) else {}
            log.info("the %s function %s: tenant ids %s", language, name, self._ids(language))

    async def _tenant_for(self, language: str) -> str:
        """The tenant id this run's invoke carries (handler/tenancy.py)."""
        if self.tenancy.kind == "header":
            named = request_tenant.get()
            tenant = tenant_id(named) if named else per_run_id()
        elif self.tenancy.kind == "per-run":
            tenant = per_run_id()
        else:
            asked = self._probed_at.get(language)
            if language not in self.platform and (asked is None or time.monotonic() - asked > PROBE_RETRY):
                await self._probe(language)
            tenant = SHARED_TENANT if self._shares(language) else per_run_id()
        context = current_request.get()
        if context is not None and isinstance(getattr(context, "run", None), dict):
            context.run["tenant_id"] = tenant  # in the run's log line
        return tenant

    # ---- internals --------------------------------------------------------------

    def _function(self, language: str) -> str:
        name = self.functions.get(language)
        if not name:
            raise Unavailable(f"no Lambda function is configured for {language} ({_setting_of(language)})")
        return name

    def _invoke(self, name: str, event: dict, tenant: str) -> object:
        from botocore.exceptions import BotoCoreError, ClientError, ReadTimeoutError

        payload = json.dumps(event, ensure_ascii=False).encode()  # UTF-8: escapes would multiply the size
        try:
            response = self.client.invoke(
                FunctionName=name, InvocationType="RequestResponse", Payload=payload, TenantId=tenant
            )
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code, message = error.get("Code", ""), error.get("Message", "")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "TooManyRequestsException" or status == 429:
                raise Throttled(message) from exc
            if code == "RequestTooLargeException":
                raise InvalidRequest(
                    f"the run request is too large for Lambda (at most {LAMBDA_REQUEST_LIMIT} bytes): {message}"
                ) from exc
            raise Unavailable(f"the {name} function could not be invoked: {code}: {message}") from exc
        except ReadTimeoutError as exc:
            raise Unavailable(f"no answer from the {name} function within {self.read_timeout:g} s") from exc
        except BotoCoreError as exc:
            raise Unavailable(f"Lambda could not be reached for the {name} function: {exc}") from exc
        body = response["Payload"].read()
        try:
            answer = json.loads(body)
        except ValueError as exc:
            raise Unavailable(f"malformed payload from the {name} function: not JSON") from exc
        if response.get("FunctionError") or is_error_payload(answer):
            raise function_error(name, answer)
        return answer
