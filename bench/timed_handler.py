"""A runtime function's handler, timed from inside: bench/lambda_overhead.py starts it as
`python -m awslambdaric timed_handler.handler` with SANDLOT_TIMED_LANGUAGE set. Importing this module
is the function's init, as for the real handler; each result also says how long the handler took, from
the event handed to it to the result returned."""

from __future__ import annotations

import importlib
import os
import time

_function = importlib.import_module(f"runtimes.{os.environ['SANDLOT_TIMED_LANGUAGE']}.lambda_function")


def handler(event, context=None):
    started = time.perf_counter()
    result = _function.handler(event, context)
    elapsed = time.perf_counter() - started
    return {**result, "handler_seconds": elapsed} if isinstance(result, dict) and "exit_code" in result else result
