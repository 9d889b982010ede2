"""The Python runtime function: `python -m awslambdaric runtimes.python.lambda_function.handler`.

Importing this module is the function's init: see runtimes/lambda_runtime.py.
"""

from runtimes.credentials import drop_credentials

drop_credentials()  # first of all: the process re-executes itself without the role's credentials

from layers.python import installed  # noqa: E402
from runtimes.lambda_runtime import RuntimeFunction  # noqa: E402
from runtimes.python.runtime import PythonRuntime  # noqa: E402

function = RuntimeFunction(PythonRuntime, lambda config: installed(config.python_layer))
handler = function.handler
