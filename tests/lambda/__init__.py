"""The Lambda deployment's tests (a package, so that its conftest does not shadow tests/conftest.py)."""
