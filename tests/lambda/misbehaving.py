"""Functions that misbehave the ways Lambda functions can, for the invoker's error mapping."""

import time


def sleeps(event, context):
    time.sleep(60)


def raises(event, context):
    raise ValueError("something broke inside the function")


def answers_garbage(event, context):
    return "not a run result"
