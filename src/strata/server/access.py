"""The server's outermost layer (ASGI middleware): every request gets an id (the answer's X-Request-Id header),
is logged in one line once answered (method, path, status, prompt and generated tokens, seconds, id: the logger
`strata.server.access`), and an exception the routes did not handle is the server's own fault: logged once with
its traceback and the id (`strata.server`), and answered 500 in OpenAI's error shape without the exception's
text, which is the server's business, not the client's. Once a request whose body was large is done, the C
allocator gives the memory it freed back to the system (malloc_trim)."""

from __future__ import annotations

import ctypes
import logging
import time
import uuid
from typing import Any

from starlette.responses import JSONResponse

from strata.server.errors import BadRequest

log = logging.getLogger("strata.server")
access_log = logging.getLogger("strata.server.access")
MAX_LOGGED_PATH = 120  # characters of a request's path in its log line
CLIENT_GONE = 499  # the status nginx logs for a client that closed the connection first
# A body this large (request.state.body_bytes) is read, decoded and parsed in buffers of megabytes, which glibc
# keeps once freed: up to 13 MiB more of its heaps free after a few such requests (the hostile corpus of
# tests/server/test_server_schema_fuzz.py). Giving them back took 0.03 to 0.7 ms, where reading such a body takes
# 30 to 300 ms.
TRIM_BODY_BYTES = 1 << 20
_malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc's; under another C library, no trim


def internal_error(request_id: str) -> BadRequest:
    return BadRequest(f"internal error (request {request_id}): the server's log has the details", None,
                      "internal_error", status=500)


class AccessLog:
    """Wraps the ASGI app `app`; a route may put (prompt tokens, generated tokens) in request.state.tokens for the
    log line, and reads its id from request.state.request_id."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = uuid.uuid4().hex[:16]
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        start = time.perf_counter()
        status = 0

        async def sending(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), (b"x-request-id", request_id.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            log.exception("request %s (%s %s) failed", request_id, scope["method"], _path(scope))
            if status == 0:  # nothing sent yet: the client gets the error, else its answer just ends
                await JSONResponse(internal_error(request_id).body(), 500)(scope, receive, sending)
        finally:
            prompt, generated = state.get("tokens", (0, 0))
            access_log.info("%s %s %d prompt=%d generated=%d %.3fs id=%s", scope["method"], _path(scope),
                            status or CLIENT_GONE, prompt, generated, time.perf_counter() - start, request_id)
            if state.get("body_bytes", 0) >= TRIM_BODY_BYTES and _malloc_trim is not None:
                _malloc_trim(0)


def _path(scope: dict) -> str:
    """The request's path as it may go in a log line: short, and its control characters escaped (a path is the
    client's text, and a newline in it must not make a line of its own)."""
    path = scope.get("path", "")[:MAX_LOGGED_PATH]
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in path)
