"""Functions that misbehave the ways Lambda functions can, for the invoker's error mapping."""

import time


def sleeps(event, context):
    time.sleep(60)


def raises(event, context):
    raise ValueError("something broke inside the function")


def answers_garbage(event, context):
    return "not a run result"


def errors_without_the_header(event, context):
    """A function error as SAM local 1.170 hands it on: awslambdaric's error payload (with its requestId), but no
    FunctionError on the response, since SAM marks only payloads of exactly errorMessage/errorType/stackTrace."""
    return {
        "errorMessage": "this environment serves tenant 't1' only",
        "errorType": "TenantRefused",
        "requestId": "r",
        "stackTrace": [],
    }


def who(event, context):
    """Not misbehaving: says which environment (pid) served the invocation, for which tenant."""
    import os

    return {"tenant_id": context.tenant_id, "pid": os.getpid()}
