"""The server on a thread of this process (uvicorn's own loop), for programs that embed it and for the tests and
benchmarks that speak to it over a real socket."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from strata.errors import InvalidArgument, StrataError
from strata.server.app import Server

STARTUP_SECONDS = 10.0
LISTEN_BACKLOG = 2048  # uvicorn's


def listening(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (0: a free port) and listening, for a server to serve on; taken before a model
    loads, so a busy port or an unknown host is said in one line at once, and a client that connects before the
    server serves waits rather than being refused. InvalidArgument for a port outside 0..65535,
    StrataError where it cannot be bound."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InvalidArgument(f"port must be in 0..65535, got {port!r}")
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except (socket.gaierror, UnicodeError) as error:
        raise StrataError(f"cannot listen on {host}:{port}: {getattr(error, 'strerror', None) or error}") from None
    # IPPROTO_TCP named, not left 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on connections whose
    # socket says TCP, and with it on, every answer after a kept-alive connection's first waited for the client's
    # delayed ACK (40 ms) between its headers and its body, and a stream's events likewise
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)  # from here a client's connection waits in the backlog, never refused
    except OSError as error:
        sock.close()
        raise StrataError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return sock


@contextmanager
def serving(server: Server, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve `server` on host:port (0: a free port) for the block; yields the base URL (ends in /v1)."""
    import uvicorn

    sock = listening(host, port)
    port = sock.getsockname()[1]
    loop = uvicorn.Server(uvicorn.Config(server.app(), log_level="warning", lifespan="off",
                                         timeout_graceful_shutdown=5))

    thread = threading.Thread(target=loop.run, kwargs={"sockets": [sock]}, name="strata-serve", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while not loop.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise StrataError(f"the server on {host}:{port} did not start within {STARTUP_SECONDS:.0f} s")
            time.sleep(0.01)
        yield f"http://{host}:{port}/v1"
    finally:
        loop.should_exit = True
        thread.join(STARTUP_SECONDS)
        sock.close()
