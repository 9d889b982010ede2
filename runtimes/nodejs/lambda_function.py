"""The Node.js runtime function: `python -m awslambdaric runtimes.nodejs.lambda_function.handler`.

Importing this module is the function's init: see runtimes/function/runtime_function.py.
"""

from runtimes.function.early import first_steps

first_steps()  # first of all: the role's credentials out (a re-exec), then the probe while the process is small

from runtimes.function.runtime_function import RuntimeFunction  # noqa: E402
from runtimes.nodejs.runtime import NodeRuntime  # noqa: E402


def _installed(config) -> list[dict]:
    from runtimes.nodejs.layer import installed  # only for {"action": "dependencies"}: not on the cold path

    return installed(config.nodejs_layer)


function = RuntimeFunction(NodeRuntime, _installed)
handler = function.handler
