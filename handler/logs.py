"""Logging: one format for the service and uvicorn, and the request a line belongs to.

`SANDLOT_LOG_FORMAT=json` (the default) writes one JSON object a line through
python-json-logger; `text` writes plain lines for a terminal, with the same
fields as `key=value`. Every line logged while a request is handled carries its
request id and trace id (from the `X-Request-Id` and W3C `traceparent` headers,
or new ones), whichever logger wrote it.
"""

from __future__ import annotations

import logging
import re
import secrets
from contextvars import ContextVar
from dataclasses import dataclass, field

from pythonjsonlogger.core import RESERVED_ATTRS

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:/+=@-]{1,128}$")
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_STANDARD = set(RESERVED_ATTRS) | {"message", "asctime", "color_message", "taskName"}


@dataclass
class RequestContext:
    """What is known about the request being handled; the run's facts are filled in as they happen."""

    request_id: str
    trace_id: str
    run: dict = field(default_factory=dict)


current_request: ContextVar[RequestContext | None] = ContextVar("sandlot_request", default=None)


def request_id_from(header: str | None) -> str:
    """The client's X-Request-Id when it is a sane token, a new one otherwise."""
    if header and _REQUEST_ID.match(header):
        return header
    return secrets.token_hex(16)


def trace_id_from(traceparent: str | None) -> str:
    """The trace id of a valid W3C traceparent header, a new one otherwise."""
    match = _TRACEPARENT.match((traceparent or "").strip().lower())
    if match and match.group(1) != "ff" and set(match.group(2)) != {"0"} and set(match.group(3)) != {"0"}:
        return match.group(2)
    return secrets.token_hex(16)


class RequestContextFilter(logging.Filter):
    """Adds request_id and trace_id to every record logged while a request is handled."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = current_request.get()
        if context is not None:
            if not hasattr(record, "request_id"):
                record.request_id = context.request_id
            if not hasattr(record, "trace_id"):
                record.trace_id = context.trace_id
        return True


class TextFormatter(logging.Formatter):
    """Plain lines, with a record's extra fields appended as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}
        if extras:
            line += " " + " ".join(f"{k}={_one_line(v)}" for k, v in extras.items())
        return line


def _one_line(value: object) -> str:
    """A value on one line: strings with spaces or control characters quoted and escaped."""
    if isinstance(value, str) and (not value or not value.isprintable() or " " in value):
        return repr(value)
    return str(value)


def logging_config(log_format: str = "json", level: str = "info") -> dict:
    """A dictConfig for the service and uvicorn alike (passed to uvicorn as its log_config)."""
    if log_format == "json":
        formatter = {
            "()": "pythonjsonlogger.orjson.OrjsonFormatter",  # UTF-8 as it is; half the json module's cost a line
            "fmt": "%(levelname)s %(name)s %(message)s",
            "rename_fields": {"levelname": "level", "name": "logger"},
            "timestamp": "time",  # ISO 8601, UTC
            "reserved_attrs": [*RESERVED_ATTRS, "color_message"],  # uvicorn's copy with terminal colours
        }
    else:
        formatter = {"()": "handler.logs.TextFormatter", "fmt": "%(asctime)s %(levelname)s %(name)s: %(message)s"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request": {"()": "handler.logs.RequestContextFilter"}},
        "formatters": {"default": formatter},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "default",
                "filters": ["request"],
            }
        },
        "root": {"handlers": ["stderr"], "level": level.upper()},
        "loggers": {
            name: {"handlers": [], "level": level.upper(), "propagate": True}
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
        },
    }


def configure(log_format: str = "json", level: str = "info") -> dict:
    """Apply the configuration to this process; returns it for uvicorn."""
    import logging.config

    config = logging_config(log_format, level)
    logging.config.dictConfig(config)
    # What no line of either format shows is not gathered for each record (the logging HOWTO's
    # "Optimization"): the caller's frame, the thread, the process and its multiprocessing name.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    return config
