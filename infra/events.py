"""Example events for the functions, in the shapes API Gateway and Lambda send; writes infra/events/*.json.

    python infra/events.py            # regenerate the examples (for `sam local invoke -e ...`)

The tests build their events with the same functions, so the examples are the
shapes that are tested.
"""

from __future__ import annotations

import base64
import json
import os
import sys

ACCOUNT = "123456789012"
API_ID = "abcdef1234"
SOURCE_IP = "192.0.2.10"  # TEST-NET-1: documentation only


def http_api_v2(
    method: str, path: str, body: str | None = None, headers: dict | None = None, query: str = "", encode: bool = False
) -> dict:
    """An API Gateway HTTP API event, payload format 2.0."""
    headers = {k.lower(): v for k, v in (headers or {}).items()}
    if body is not None:
        headers.setdefault("content-type", "application/json")
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": query,
        "headers": {"host": f"{API_ID}.execute-api.us-east-1.amazonaws.com", **headers},
        "requestContext": {
            "accountId": ACCOUNT,
            "apiId": API_ID,
            "domainName": f"{API_ID}.execute-api.us-east-1.amazonaws.com",
            "domainPrefix": API_ID,
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": SOURCE_IP,
                "userAgent": "example",
            },
            "requestId": "JKJaXmPLvHcESHA=",
            "routeKey": "$default",
            "stage": "$default",
            "time": "30/Nov/2026:10:00:00 +0000",
            "timeEpoch": 1795946400000,
        },
        "body": base64.b64encode(body.encode()).decode() if encode and body is not None else body,
        "isBase64Encoded": encode,
    }


def rest_api_v1(
    method: str,
    path: str,
    body: str | None = None,
    headers: dict | None = None,
    query: dict | None = None,
    encode: bool = False,
) -> dict:
    """An API Gateway REST API proxy event, payload format 1.0."""
    headers = dict(headers or {})
    if body is not None:
        headers.setdefault("Content-Type", "application/json")
    headers.setdefault("Host", f"{API_ID}.execute-api.us-east-1.amazonaws.com")
    return {
        "resource": "/{proxy+}",
        "path": path,
        "httpMethod": method,
        "headers": headers,
        "multiValueHeaders": {k: [v] for k, v in headers.items()},
        "queryStringParameters": query or None,
        "multiValueQueryStringParameters": {k: [v] for k, v in query.items()} if query else None,
        "pathParameters": {"proxy": path.lstrip("/")},
        "stageVariables": None,
        "requestContext": {
            "accountId": ACCOUNT,
            "apiId": API_ID,
            "resourcePath": "/{proxy+}",
            "httpMethod": method,
            "path": f"/prod{path}",
            "stage": "prod",
            "protocol": "HTTP/1.1",
            "requestId": "c6af9ac6-7b61-11e6-9a41-93e8deadbeef",
            "identity": {"sourceIp": SOURCE_IP, "userAgent": "example"},
        },
        "body": base64.b64encode(body.encode()).decode() if encode and body is not None else body,
        "isBase64Encoded": encode,
    }


RUN = {"language": "python3", "code": "print(1 + 1)", "preload": "", "enable_network": True}


def examples() -> dict[str, dict]:
    key = {"X-Api-Key": "replace-with-your-api-key"}
    return {
        "api-run-http-v2.json": http_api_v2("POST", "/v1/sandbox/run", json.dumps(RUN), key),
        "api-health-http-v2.json": http_api_v2("GET", "/health"),
        "api-run-rest-v1.json": rest_api_v1("POST", "/v1/sandbox/run", json.dumps(RUN), key),
        "api-direct-invoke.json": RUN,
        "runtime-python3-run.json": RUN,
        "runtime-nodejs-run.json": {"language": "nodejs", "code": "console.log(1 + 1)", "enable_network": True},
        "runtime-probe.json": {"action": "probe"},
        "runtime-dependencies.json": {"action": "dependencies"},
    }


def main(directory: str) -> None:
    os.makedirs(directory, exist_ok=True)
    for name, event in examples().items():
        with open(os.path.join(directory, name), "w") as f:
            json.dump(event, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "events"))
