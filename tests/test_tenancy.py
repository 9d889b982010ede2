"""SANDLOT_LAMBDA_TENANCY and tenant ids: the policy's forms, ids in Lambda's format that no caller can forge into
another kind, and the request's tenant carried to the invoker per request (no AWS, no runtime)."""

from __future__ import annotations

import asyncio
import re

import pytest

from handler import run_path
from handler.settings import SettingsError, load_settings
from handler.tenancy import SHARED_TENANT, TenancyPolicy, per_run_id, request_tenant, tenant_id
from runtimes.payload import RunOutcome, RunResult

LAMBDA_FORMAT = re.compile(r"[a-zA-Z0-9._:/=+\-@ ]{1,256}")  # botocore's model of Invoke's TenantId


@pytest.mark.parametrize(
    ("value", "policy"),
    [
        ("auto", TenancyPolicy("auto")),
        ("per-run", TenancyPolicy("per-run")),
        ("header:X-Tenant-Id", TenancyPolicy("header", "X-Tenant-Id")),
    ],
)
def test_the_policy_takes_three_forms(monkeypatch, value, policy):
    monkeypatch.setenv("SANDLOT_CONFIG", "/nonexistent.yaml")
    assert TenancyPolicy.parse(value) == policy
    assert load_settings(SANDLOT_LAMBDA_TENANCY=value).lambda_tenancy == policy


@pytest.mark.parametrize("value", ["shared", "header:", "header:Bad Name", "per-tenant", "header:X:Y"])
def test_a_bad_policy_stops_start_up_naming_the_setting(monkeypatch, value):
    monkeypatch.setenv("SANDLOT_CONFIG", "/nonexistent.yaml")
    with pytest.raises(SettingsError, match="SANDLOT_LAMBDA_TENANCY"):
        load_settings(SANDLOT_LAMBDA_TENANCY=value)


NAMES = ["acme", "Acme Corp", "a/b=c+d@e.f:g", "t:acme", "run:123", "shared", "é", "a\nb", "x" * 300, " padded "]


def test_tenant_ids_fit_lambdas_format_and_stay_distinct():
    ids = [tenant_id(name) for name in NAMES]
    assert all(LAMBDA_FORMAT.fullmatch(i) for i in ids), ids
    assert len(set(ids)) == len(NAMES)  # distinct names, distinct ids
    assert tenant_id("acme") == "t:acme" and tenant_id("Acme Corp") == "t:Acme Corp"  # readable where it can be
    assert tenant_id("é").startswith("h:") and tenant_id("x" * 300).startswith("h:")
    # no name gives a per-run id or the shared one
    assert not any(i.startswith("run:") or i == SHARED_TENANT for i in ids)
    assert tenant_id("acme") == tenant_id("acme")


def test_per_run_ids_are_never_repeated():
    ids = {per_run_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(LAMBDA_FORMAT.fullmatch(i) and i.startswith("run:") for i in ids)


def test_the_run_path_hands_each_request_its_own_tenant():
    """Concurrent requests: each invoke sees the tenant its own request named, also after awaiting."""

    async def invoke(request):
        seen = request_tenant.get()
        await asyncio.sleep(0.01)
        assert request_tenant.get() == seen
        return RunResult(stdout=str(seen), stderr="", error="", exit_code=0, outcome=RunOutcome.OK)

    async def main():
        body = {"language": "python3", "code": "1"}
        replies = await asyncio.gather(*(run_path.run(body, True, invoke, tenant) for tenant in ("a", "b", None)))
        assert request_tenant.get() is None  # nothing left behind for whatever runs next
        return [reply.body["data"]["stdout"] for reply in replies]

    assert asyncio.run(main()) == ["a", "b", "None"]
