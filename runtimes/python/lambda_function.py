"""The Python runtime function: `python -m awslambdaric runtimes.python.lambda_function.handler`.

Importing this module is the function's init: see runtimes/lambda_runtime.py.
"""

from layers.python import installed
from runtimes.lambda_runtime import RuntimeFunction
from runtimes.python.runtime import PythonRuntime

function = RuntimeFunction(PythonRuntime, lambda config: installed(config.python_layer))
handler = function.handler
