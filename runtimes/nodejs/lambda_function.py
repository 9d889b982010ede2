"""The Node.js runtime function: `python -m awslambdaric runtimes.nodejs.lambda_function.handler`.

Importing this module is the function's init: see runtimes/lambda_runtime.py.
"""

from runtimes.credentials import drop_credentials

drop_credentials()  # first of all: the process re-executes itself without the role's credentials

from layers.nodejs import installed  # noqa: E402
from runtimes.lambda_runtime import RuntimeFunction  # noqa: E402
from runtimes.nodejs.runtime import NodeRuntime  # noqa: E402

function = RuntimeFunction(NodeRuntime, lambda config: installed(config.nodejs_layer))
handler = function.handler
