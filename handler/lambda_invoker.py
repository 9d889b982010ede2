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
- the function's own errors: errorType `Unavailable` and `InvalidRequest` carry the
  runtime's answer; "Task timed out", any other function error, a payload that is
  not a run result, or no answer at all: Unavailable -> -500 saying which.
"""

from __future__ import annotations

import asyncio
import json
import logging

from pydantic import ValidationError

from layers.store import LayerBuildError
from runtimes.payload import (
    LAMBDA_REQUEST_LIMIT,
    NETWORK_DISABLED,
    InvalidRequest,
    RunRequest,
    RunResult,
    Throttled,
    Unavailable,
    describe,
)

log = logging.getLogger("sandlot.lambda")
READ_TIMEOUT_MARGIN = 10.0  # seconds over the function's timeout before the client gives up


def function_error(name: str, payload: object) -> Exception:
    """What a function error (FunctionError set on the response) means for the run."""
    if not isinstance(payload, dict):
        return Unavailable(f"the {name} function failed without saying why")
    kind = str(payload.get("errorType", ""))
    message = str(payload.get("errorMessage", ""))
    if kind == "Unavailable":
        return Unavailable(message)
    if kind == "InvalidRequest":
        return InvalidRequest(message, http_status=200 if message == NETWORK_DISABLED else 400)
    if "Task timed out" in message:
        return Unavailable(f"the {name} function timed out: {message}")
    return Unavailable(f"the {name} function failed: {kind or 'error'}: {message}")


class LambdaInvoker:
    """Runs on Lambda: one runtime function per language."""

    def __init__(
        self,
        functions: dict[str, str],
        function_timeout: float,
        max_connections: int = 10,
        client=None,
        probe_at_start: bool = True,
    ):
        self.functions = {language: name for language, name in functions.items() if name}
        self.function_timeout = function_timeout
        self.read_timeout = function_timeout + READ_TIMEOUT_MARGIN
        self.max_connections = max_connections
        self._client = client
        self.platform: dict[str, dict] = {}  # each function's protections record, asked at start
        self._probing = probe_at_start  # not ready until start() has asked each function for its record

    @classmethod
    def from_settings(cls, settings, probe_at_start: bool = True) -> LambdaInvoker:
        return cls(
            {"python3": settings.SANDLOT_LAMBDA_PYTHON3_FUNCTION, "nodejs": settings.SANDLOT_LAMBDA_NODEJS_FUNCTION},
            settings.lambda_function_timeout,
            max_connections=max(10, settings.MAX_WORKERS),
            probe_at_start=probe_at_start,
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
            self._client = boto3.client("lambda", config=config)
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
            for language, name in self.functions.items():
                try:
                    self.platform[language] = await asyncio.to_thread(self._invoke, name, {"action": "probe"})
                except (Unavailable, Throttled, InvalidRequest) as exc:
                    log.warning("could not probe the %s function %s: %s", language, name, exc)
        finally:
            self._probing = False

    async def stop(self) -> None:
        pass

    async def invoke(self, request: RunRequest) -> RunResult:
        name = self._function(request.language)
        answer = await asyncio.to_thread(self._invoke, name, request.to_payload())
        try:
            return RunResult.model_validate(answer)
        except ValidationError as exc:
            problem = describe(exc.errors())
            raise Unavailable(f"malformed payload from the {name} function: not a run result ({problem})") from exc

    def ready(self) -> bool:
        return bool(self.functions) and not self._probing

    def status(self) -> dict:
        status = {}
        for language in ("python3", "nodejs"):
            name = self.functions.get(language, "")
            probe = self.platform.get(language, {})
            status[language] = {
                "ready": bool(name) and not probe.get("refused"),
                "function": name,
                "error": "" if name else f"no function configured (SANDLOT_LAMBDA_{language.upper()}_FUNCTION)",
                "protections": probe.get("protections"),
                "platform": probe.get("platform"),
                "refused": probe.get("refused", ""),
            }
        return status

    # ---- layer administration: the layer is baked into each function's image ------------

    async def dependencies(self, language: str) -> list[dict[str, str]]:
        answer = await asyncio.to_thread(self._invoke, self._function(language), {"action": "dependencies"})
        if not isinstance(answer, dict) or not isinstance(answer.get("dependencies"), list):
            raise Unavailable("malformed payload from the runtime function: no dependency list")
        return answer["dependencies"]

    async def update_dependencies(self, language: str) -> None:
        raise LayerBuildError(
            f"the {language} dependency layer is baked into the runtime function's image: "
            "change the requirements, rebuild the image and deploy it (sam build && sam deploy)"
        )

    # ---- internals --------------------------------------------------------------

    def _function(self, language: str) -> str:
        name = self.functions.get(language)
        if not name:
            raise Unavailable(
                f"no Lambda function is configured for {language} (SANDLOT_LAMBDA_{language.upper()}_FUNCTION)"
            )
        return name

    def _invoke(self, name: str, event: dict) -> object:
        from botocore.exceptions import BotoCoreError, ClientError, ReadTimeoutError

        payload = json.dumps(event, ensure_ascii=False).encode()  # UTF-8: escapes would multiply the size
        try:
            response = self.client.invoke(FunctionName=name, InvocationType="RequestResponse", Payload=payload)
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
        if response.get("FunctionError"):
            raise function_error(name, answer)
        return answer
