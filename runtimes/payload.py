"""The run contract: run request, run result and the errors a run can meet instead of a result.

The same shapes cross every seam: what the LocalInvoker hands a runtime, what the
LambdaInvoker sends as a runtime function's payload and gets back, what a direct
invoke of the API function carries. On the wire a result is dify-sandbox's dict
(stdout, stderr, error, exit_code) plus duration, truncated and outcome; in code
it is a RunResult, whose outcome is decided once, where the result is built (the
jail, runtimes/jail/service/outcome.py), and only read everywhere else (metrics, logs,
the CLI). This module imports nothing of the jail, so the API function (a zip on
Lambda, no libseccomp there) can use it.

No pydantic here: a runtime function's cold path (a fresh environment's first
run: init, request, run, result) imports none (it cost that path about 70 ms of
CPU). A RunResult is a plain frozen dataclass, built by the jail; its wire
schema (OpenAPI) and the check of a result that comes from outside
(`RunResult.model_validate`, the LambdaInvoker's answers) are pydantic's model of
the same shape, runtimes/run_models.py, imported only when asked for.
RunRequest is pydantic's (the service's bodies extend it), this module's name
once asked for; a runtime function reads its event with `read_request` (the
same rules, stricter spellings, anything else handed to the model: its error,
or its request). The dependency goes one way: this module uses run_models
(lazily), run_models uses nothing of it (a run's outcome, which both name, is
runtimes/outcomes.py's).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from runtimes.languages import WIRE_NAMES
from runtimes.outcomes import RunOutcome

if TYPE_CHECKING:
    from runtimes.run_models import RunRequest

NETWORK_DISABLED = "network is disabled, please enable it in the configuration"
UNSUPPORTED_LANGUAGE = "unsupported language"

# Lambda's synchronous invocation limits: the request payload, and the response a runtime may post.
LAMBDA_REQUEST_LIMIT = 6_291_456
LAMBDA_RESPONSE_LIMIT = 6_291_556
OUTPUT_LIMIT_LINE = "error: output limit exceeded"
# The tenant id the API shares between all its runs where a runtime function reports seccomp in force
# (SANDLOT_LAMBDA_TENANCY=auto). A function without the filter refuses it: runs there need ids of their own.
SHARED_TENANT = "shared"


class Unavailable(RuntimeError):
    """The sandbox cannot run this now (runtime down, jail cannot be built): a -500 envelope naming why.

    The one such error: each invoker turns what its own machinery raises into this at its seam."""


class TenantRefused(Unavailable):
    """A runtime function's environment does not serve this invocation's tenant id (none, the shared one where no
    seccomp filter is in force, or another tenant's): refused before anything of the run was executed."""


class Throttled(RuntimeError):
    """Too many runs at once further down (e.g. Lambda's concurrency): the 503 envelope."""


class InvalidRequest(ValueError):
    """The run request breaks a rule (shape, language, network): a -400 envelope with this message."""

    def __init__(self, message: str, http_status: int = 400):
        super().__init__(message)
        self.http_status = http_status


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """A run's result: `data` of the success envelope (also when the user's code failed), and what a runtime
    function returns. Its fields' meaning and wire schema: runtimes/run_models.py's RunResult."""

    stdout: str
    stderr: str
    error: str
    exit_code: int
    duration: float = 0.0
    truncated: bool = False
    outcome: RunOutcome

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", RunOutcome(self.outcome))

    def to_wire(self) -> dict:
        """The result as it travels: a plain JSON-ready dict."""
        return {field.name: getattr(self, field.name) for field in fields(self)} | {"outcome": self.outcome.value}

    @classmethod
    def model_validate(cls, data: object) -> RunResult:
        """A result from outside (a runtime function's answer), checked by the wire model; its ValidationError
        (a ValueError) says what is wrong. Unknown fields are ignored."""
        from runtimes.run_models import RunResult as Model

        checked = Model.model_validate(data)
        return cls(**{field.name: getattr(checked, field.name) for field in fields(cls)})


@dataclass(frozen=True)
class RequestFields:
    """A run request read by `read_request`: RunRequest's fields, without the model (a runtime function's)."""

    language: str
    code: str
    preload: str = ""
    enable_network: bool = False
    timeout: float | int | None = None
    memory_limit_mb: int | None = None
    stdin: str = ""

    def model_copy(self, update: dict) -> RequestFields:
        return replace(self, **update)

    def to_payload(self) -> dict:
        values = {field.name: getattr(self, field.name) for field in fields(self)}
        return {name: value for name, value in values.items() if value is not None}


_REQUEST_TYPES = {"language": str, "code": str, "preload": str, "enable_network": bool, "stdin": str}


def read_request(data: object, network_allowed: bool) -> RequestFields | RunRequest:
    """parse_request's rules without pydantic for a request that plainly keeps them (RunRequest's fields, each
    of its exact type, bounds kept); any other is parse_request's: its InvalidRequest, or its request."""
    if isinstance(data, dict) and data.keys() <= _REQUEST_FIELDS and data.get("language") in WIRE_NAMES:
        plain = all(type(data[name]) is kind for name, kind in _REQUEST_TYPES.items() if name in data)
        timeout, memory = data.get("timeout"), data.get("memory_limit_mb")
        plain = plain and bool(data.get("code")) and (memory is None or (type(memory) is int and memory > 0))
        plain = plain and (timeout is None or (type(timeout) in (int, float) and 0 < timeout < math.inf))
        if plain and (network_allowed or not data.get("enable_network")):
            return RequestFields(**data)
    return parse_request(data, network_allowed)


def describe(errors: list[dict]) -> str:
    """pydantic's errors in one line a client can act on."""
    parts = []
    for err in errors:
        where = ".".join(str(p) for p in err["loc"])
        message = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


def parse_request(data: object, network_allowed: bool, model: type[RunRequest] | None = None) -> RunRequest:
    """A run request from a decoded body or event, every rule checked; InvalidRequest says what is wrong."""
    from pydantic import ValidationError

    from runtimes.run_models import RunRequest

    model = model or RunRequest
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object")
    if "language" in data and data["language"] not in WIRE_NAMES:
        raise InvalidRequest(UNSUPPORTED_LANGUAGE)
    try:
        request = model.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequest(describe(exc.errors())) from exc
    if request.enable_network and not network_allowed:
        raise InvalidRequest(NETWORK_DISABLED, http_status=200)  # dify-sandbox answers this one with 200
    return request


_REQUEST_FIELDS = frozenset(field.name for field in fields(RequestFields))


def encoded_size(value: object, ascii_only: bool) -> int:
    return len(json.dumps(value, ensure_ascii=ascii_only).encode())


def fit_result(result: RunResult, limit: int, ascii_only: bool = True) -> RunResult:
    """The result, or one cut down to `limit` encoded bytes that says `error: output limit exceeded`.

    ascii_only: whether the transport escapes non-ASCII as \\uXXXX (awslambdaric does, unless the
    platform names python3.12+), which can make a result six times its character count.
    """
    wire = result.to_wire()
    if encoded_size(wire, ascii_only) <= limit:
        return result
    cut = dict(wire, exit_code=-1, truncated=True, outcome=RunOutcome.OUTPUT_LIMIT.value)
    header = f"process exited with code -1\n{OUTPUT_LIMIT_LINE}\n"
    stdout, stderr = cut.get("stdout", ""), cut.get("stderr", "")
    while True:
        cut.update(stdout=stdout, stderr=stderr, error=header + stderr)
        excess = encoded_size(cut, ascii_only) - limit
        if excess <= 0:
            return RunResult(**cut)
        # drop about as many characters as the excess is worth at their average encoded size
        if stdout:
            stdout = stdout[: len(stdout) - _chars_worth(stdout, excess, ascii_only)]
        elif stderr:
            stderr = stderr[: len(stderr) - _chars_worth(stderr, (excess + 1) // 2, ascii_only)]  # counted twice
        else:
            raise ValueError(f"a result cannot fit {limit} bytes")


def _chars_worth(text: str, size: int, ascii_only: bool) -> int:
    """How many characters from the end of text encode to about `size` bytes (at least one)."""
    per_char = max(1.0, (encoded_size(text, ascii_only) - 2) / len(text))
    return min(len(text), max(1, math.ceil(size / per_char)))


def __getattr__(name: str):
    if name == "RunRequest":  # pydantic's model: imported when first asked for (see above)
        from runtimes import run_models

        value = globals()[name] = getattr(run_models, name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
