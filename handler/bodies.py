"""A request's body, read once for every route: capped in size, decoded as JSON, and the request's end.

The run route, the package routes, the admin page's forms and the edge's log line
(handler/middleware.py) read bodies through here, each answering what is wrong in
its own words: the cap and the messages are the route's, the reading is this.
"""

from __future__ import annotations

import json

from starlette.requests import Request

MALFORMED = "malformed JSON body"
TOO_DEEP = "malformed JSON body: nested too deeply"


class BodyTooLarge(Exception):
    """The body is (or says it is) longer than the route's limit."""

    def __init__(self, limit: int):
        super().__init__(f"request body too large (limit {limit} bytes)")
        self.limit = limit


class MalformedJSON(ValueError):
    """A body that is not JSON (MALFORMED), or nested too deeply to decode (TOO_DEEP): the message says which."""


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, at most `limit` bytes: BodyTooLarge past it (at once when Content-Length says so),
    ClientDisconnect (Starlette's) when the client goes away while it is read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes) -> object:
    """The decoded body, or MalformedJSON."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise MalformedJSON(TOO_DEEP) from None
    except ValueError:  # UnicodeDecodeError too: bytes that are no text
        raise MalformedJSON(MALFORMED) from None


async def until_disconnected(request: Request) -> None:
    """Returns when the client has gone away (its http.disconnect): what a queued run waits on beside its turn."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
