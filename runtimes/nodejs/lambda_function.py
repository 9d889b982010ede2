"""The Node.js runtime function: `python -m awslambdaric runtimes.nodejs.lambda_function.handler`.

Importing this module is the function's init: see runtimes/lambda_runtime.py.
"""

from layers.nodejs import installed
from runtimes.lambda_runtime import RuntimeFunction
from runtimes.nodejs.runtime import NodeRuntime

function = RuntimeFunction(NodeRuntime, lambda config: installed(config.nodejs_layer))
handler = function.handler
