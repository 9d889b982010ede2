"""The one run path, free of any transport: validation, the network rule, the invoker, the envelope.

The Starlette route (after auth, body limits and admission) and the API
function's direct invoke both call `run`; the runtime functions check the same
rules with `runtimes.payload.parse_request`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from handler import envelope
from handler.envelope import Reply
from handler.models import RunBody
from handler.tenancy import request_tenant
from runtimes.payload import InvalidRequest, RunRequest, RunResult, Throttled, Unavailable, parse_request

Invoke = Callable[[RunRequest], Awaitable[RunResult]]


async def run(data: object, network_allowed: bool, invoke: Invoke, tenant: str | None = None) -> Reply:
    """The envelope for one decoded run request (a dict from an HTTP body or a direct invoke).

    tenant: the tenant the request names, if the caller knows one (handler/tenancy.py); the invoker reads it
    from `request_tenant` while this request's run is invoked."""
    try:
        body = parse_request(data, network_allowed, model=RunBody)
    except InvalidRequest as exc:
        return envelope.bad_request_reply(str(exc), exc.http_status)
    named = request_tenant.set(tenant)
    try:
        result = await invoke(body.run_request())
    except InvalidRequest as exc:  # a rule checked further down (a runtime function checks them too)
        return envelope.bad_request_reply(str(exc), exc.http_status)
    except Throttled:
        return envelope.too_many_requests_reply()
    except Unavailable as exc:
        return envelope.unavailable_reply(str(exc))
    finally:
        request_tenant.reset(named)
    return envelope.success_reply(result.to_wire())
