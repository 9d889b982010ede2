"""The package routes and the admin page on the lambda backend: the baked list, and adds refused with what to do."""

import os
import re
import sys

import httpx
import pytest
from functions import boto_environment

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

from service import Service  # noqa: E402

ADMIN_KEY = "admin-" + os.urandom(8).hex()


@pytest.fixture(scope="module")
def lambda_service(invoke_api):
    service = Service(SANDLOT_BACKEND="lambda", SANDLOT_ADMIN_KEY=ADMIN_KEY, **boto_environment(invoke_api)).start()
    yield service
    service.stop()


def test_the_routes_show_the_baked_list_and_refuse_changes(lambda_service):
    with httpx.Client(base_url=lambda_service.url, headers={"X-Api-Key": ADMIN_KEY}, timeout=60) as client:
        listed = client.get("/v1/sandlot/packages", params={"language": "python3"}).json()["data"]
        assert listed["editable"] is False and "rebuild the image and deploy" in listed["message"]
        assert {"requests", "httpx", "jinja2"} <= {row["name"].lower() for row in listed["packages"]}
        assert all(row["kind"] == "baked" for row in listed["packages"])
        for response in (
            client.post("/v1/sandlot/packages", json={"language": "python3", "spec": "six"}),
            client.delete("/v1/sandlot/packages", params={"language": "nodejs", "name": "is-number"}),
        ):
            assert response.status_code == 409
            assert (
                response.json()["code"] == -409
                and "baked into the runtime function's image" in response.json()["message"]
            )
        assert client.get("/v1/sandlot/builds").json()["data"]["builds"] == []


def test_the_page_shows_the_baked_list_without_an_add_form(lambda_service):
    with httpx.Client(base_url=lambda_service.url, timeout=60) as client:
        assert client.post("/admin/login", data={"key": ADMIN_KEY}).status_code == 303
        page = client.get("/admin").text
        token = re.search(r'name="csrf" value="([0-9a-f]+)"', page).group(1)
        refused = client.post("/admin/packages", data={"csrf": token, "language": "python3", "spec": "six"})
    assert 'id="baked-python3"' in page and "rebuild the image and deploy" in page
    assert re.search(r'<tr data-name="requests">', page, re.IGNORECASE)
    assert 'id="add-form"' not in page and "Remove</button>" not in page
    assert refused.status_code == 409 and "baked into the runtime function" in refused.text
