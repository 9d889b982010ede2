"""Which tenant id a run's invoke carries: SANDLOT_LAMBDA_TENANCY, and ids in Lambda's format.

The runtime functions are deployed with Lambda's tenant isolation (TenancyConfig
PER_TENANT): Lambda runs a tenant id's invocations only in execution
environments of that id's own. So the id the LambdaInvoker passes (boto3's
TenantId) decides which runs may ever share an environment:

- `per-run`: a fresh id for every run. A run's environment has served no earlier
  run and will serve no later one; every run pays a cold start.
- `header:<Name>`: the id of the tenant the request names in that header (the
  operator's gateway sets it; a direct invoke of the API function may carry it
  as `tenant_id`). A run can reach at most later runs of its own tenant. A
  request without it gets a fresh id, never a shared one.
- `auto` (the default): where a runtime function reports the seccomp filter in
  force, one id shared by every run (SHARED_TENANT: warm environments, isolation
  from the jail); where it does not, a fresh id per run.

Ids are made so that no caller can choose one of another kind: a tenant's own
is `t:<its name>` when that fits Lambda's format, else `h:<sha-256 of it>`; a
run's is `run:<random>`; the shared one is `shared`.

The route (or the direct invoke) says which tenant a request is for by passing
it to the run path, which holds it in `request_tenant` for the invoker to read:
a context variable, so concurrent requests never see each other's.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from contextvars import ContextVar
from dataclasses import dataclass

from runtimes.payload import SHARED_TENANT

__all__ = ["SHARED_TENANT", "TenancyPolicy", "per_run_id", "request_tenant", "tenant_id"]

# Lambda's TenantId (botocore's model of Invoke: 1 to 256 of these characters)
LAMBDA_TENANT_ID = re.compile(r"[a-zA-Z0-9._:/=+\-@ ]{1,256}")
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an HTTP field name (RFC 9110's token)

# the tenant the current request names (its header, or a direct invoke's tenant_id); set by the run path
request_tenant: ContextVar[str | None] = ContextVar("sandlot_request_tenant", default=None)


@dataclass(frozen=True)
class TenancyPolicy:
    kind: str  # "auto" | "per-run" | "header"
    header: str = ""  # kind "header": the request header naming the tenant

    @classmethod
    def parse(cls, value: str) -> TenancyPolicy:
        """From SANDLOT_LAMBDA_TENANCY; ValueError says what is accepted."""
        value = value.strip()
        if value in ("auto", "per-run"):
            return cls(value)
        kind, sep, header = value.partition(":")
        if kind == "header" and sep and _HEADER_NAME.fullmatch(header.strip()):
            return cls("header", header.strip())
        raise ValueError("must be `auto`, `per-run` or `header:<Name>` (the request header naming the tenant)")

    def describe(self) -> str:
        if self.kind == "header":
            return f"per tenant, from the {self.header} header (a fresh id per run without it)"
        return {"auto": "auto", "per-run": "a fresh id per run"}[self.kind]


def per_run_id() -> str:
    """An id no other run will ever carry: an environment of its own."""
    return f"run:{uuid.uuid4().hex}"


def tenant_id(name: str) -> str:
    """A tenant's name (a header's value) as a Lambda tenant id of its own: readable where Lambda's format allows,
    a digest where it does not; distinct names always give distinct ids, and never a per-run or the shared id."""
    readable = f"t:{name}"
    if LAMBDA_TENANT_ID.fullmatch(readable) and readable == readable.strip():
        return readable
    return "h:" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
