"""The API function on Lambda: `handler.lambda_function.handler`.

API Gateway events (HTTP API payload 2.0, REST 1.0, and ALB) go through Mangum,
lifespan off, into the same Starlette app as the local service, whose invoker is
the LambdaInvoker. Any other event is a direct invoke: a run request dict,
answered with the envelope the HTTP route would give (IAM guards direct
invokes, so no API key is asked for there). A direct invoke may name its tenant
as `tenant_id` beside the request's fields: with SANDLOT_LAMBDA_TENANCY
`header:<Name>` it counts as that header would (handler/tenancy.py).

This module ships as a zip: importing it needs no libseccomp, no node and no
jail module (a test checks it).
"""

from __future__ import annotations

import asyncio
import logging

from mangum import Mangum

from handler import envelope, run_path
from handler.app import create_app
from handler.lambda_invoker import LambdaInvoker
from handler.settings import SettingsError, load_settings

settings = load_settings(SANDLOT_BACKEND="lambda")
try:
    _key_warning = settings.check_keys()  # the template's ApiKey: no key anyone knows, or the init fails
except SettingsError as exc:
    raise SystemExit(f"sandlot: {exc}") from None  # one line on stderr, exit status 1: the init error says so
if _key_warning:
    logging.getLogger("sandlot.settings").warning("%s", _key_warning)
invoker = LambdaInvoker.from_settings(settings, probe_at_start=False)  # no lifespan here: ready at once
invoker.connect()  # one boto3 client for the life of the instance
app = create_app(settings, invoker)
loop = asyncio.new_event_loop()
asyncio.set_event_loop(loop)  # Mangum runs each request on the current loop; direct invokes use it too
http = Mangum(app, lifespan="off")


def is_http_event(event: object) -> bool:
    """An API Gateway (v1, v2) or ALB event, as Mangum infers them."""
    if not isinstance(event, dict) or "requestContext" not in event:
        return False
    return "httpMethod" in event or "rawPath" in event or "routeKey" in event


def direct_invoke(event: object) -> dict:
    """A run request straight from another AWS service: the envelope's body."""
    tenant = None
    if isinstance(event, dict) and "tenant_id" in event:
        event = dict(event)
        tenant = event.pop("tenant_id")
        if not isinstance(tenant, str) or not tenant:
            return envelope.bad_request_reply("tenant_id: must be a non-empty string").body
        if invoker.tenancy.kind != "header":
            tenant = None  # the operator chose ids that do not come from the caller
    reply = loop.run_until_complete(run_path.run(event, settings.ENABLE_NETWORK, invoker.invoke, tenant))
    return reply.body


def handler(event: object, context: object = None) -> dict:
    if is_http_event(event):
        return http(event, context)
    return direct_invoke(event)
