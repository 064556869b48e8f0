"""`strata serve`: the OpenAI-compatible server (chat completions, completions, models, health, metrics) on one
model, bound to localhost unless told otherwise."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from strata.cli import chat_template
from strata.cli import session as session_options
from strata.cli.help import ShowDefaults
from strata.errors import InvalidArgument, OutOfMemory, StrataError

API_KEY_VARIABLE = "STRATA_API_KEY"


def register(commands) -> None:
    sub = commands.add_parser("serve", help="an OpenAI-compatible HTTP server (/v1/chat/completions, ...)",
                              formatter_class=ShowDefaults)
    session_options.add_engine_arguments(sub)
    sub.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    sub.add_argument("--port", type=int, default=8000, help="port to listen on (taken before the model loads)")
    sub.add_argument("--api-key", default=os.environ.get(API_KEY_VARIABLE),
                     help=f"require 'Authorization: Bearer KEY' on every request (default: ${API_KEY_VARIABLE}, "
                          "which keeps the key out of the process list; none: no key)")
    sub.add_argument("--sessions", type=int, default=1,
                     help="conversations held at once, each with its own state (memory allowing)")
    sub.add_argument("--batch", type=int, default=1, metavar="B",
                     help="sessions whose decode steps may run together, each batch only where batches of its size "
                          "measured faster than stepping alone (default 1: one request computes at a time, until "
                          "the GPU box's served figures decide it: docs/server.md); a B above --sessions makes B "
                          "sessions, as many as memory holds")
    sub.add_argument("--decode-stall", type=float, default=0.0, metavar="MS",
                     help="with --batch above 1: how long the decoding sessions' next step may wait while new "
                          "requests' prompt chunks run (default 0: a decode batch after every chunk; more brings a "
                          "burst's first tokens sooner: docs/server.md)")
    sub.add_argument("--queue", type=int, default=16, help="requests that may wait; more are answered 429")
    sub.add_argument("--name", "--alias", default=None,
                     help="the model's id in /v1/models (default: the file's stem; --alias is llama-server's "
                          "spelling); a request naming any model is answered by this one, as llama-server does")
    sub.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                     help="let browser pages from ORIGIN (e.g. http://localhost:5173, or * for any) call the "
                          "server (repeatable; default: none)")
    sub.add_argument("--quiet", action="store_true", help="no access log line per request on stderr")
    sub.add_argument("--max-body", type=int, default=None, metavar="BYTES",
                     help="request bodies larger are refused (413) unread (default: the server's, 8 MiB)")
    chat_template.add_arguments(sub)
    sub.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ImportError:
        raise StrataError("the server needs its extra packages: pip install 'strata-moe[server]'") from None
    from strata.server import Server
    from strata.server.background import listening

    if args.sessions < 1 or args.queue < 0 or (args.max_body is not None and args.max_body < 1):
        raise InvalidArgument(f"--sessions and --max-body must be >= 1 and --queue >= 0, got {args.sessions}, "
                              f"{args.max_body} and {args.queue}")
    if args.batch < 1:
        raise InvalidArgument(f"--batch must be >= 1, got {args.batch}")
    if not 0 <= args.decode_stall < float("inf"):
        raise InvalidArgument(f"--decode-stall must be a number of milliseconds >= 0, got {args.decode_stall}")
    wanted = max(args.sessions, args.batch)
    template = chat_template.chosen(args)
    sock = listening(args.host, args.port)  # before the model loads: a busy port is said at once
    try:
        with session_options.opened_model(args) as model:
            sessions = []
            try:
                made_sessions(model, args, wanted, sessions, reduce=args.batch > 1)
                if not chat_template.install(template, sessions):
                    print(f"strata serve: {args.model} carries no chat template: /v1/chat/completions answers 400 "
                          "until one is given (--chat-template, --chat-template-file); /v1/completions works",
                          file=sys.stderr)
                limits = {} if args.max_body is None else {"max_body_bytes": args.max_body}
                batch = min(args.batch, len(sessions))
                server = Server(sessions, args.name or Path(args.model).stem, api_key=args.api_key,
                                max_waiting=args.queue, batch=batch, cors_origins=args.cors_origin,
                                decode_stall_seconds=args.decode_stall / 1000,
                                **session_options.control_vectors(args), **limits)
                host, port = sock.getsockname()[:2]  # the port taken, where --port 0 asked for any free one
                print(f"strata serve: {args.model} on http://{_url_host(host)}:{port}/v1 ({args.engine} engine, "
                      f"{len(sessions)} session(s) of {sessions[0].engine.context} tokens), batch {batch}",
                      file=sys.stderr, flush=True)
                try:
                    with _logged_to_stderr(quiet=args.quiet):
                        uvicorn.Server(uvicorn.Config(server.app(), log_level="warning")).run(sockets=[sock])
                except KeyboardInterrupt:
                    pass  # uvicorn raises the Ctrl-C it stopped on again once it has shut down: the stop asked for
                finally:
                    server.close()
            finally:
                for session in sessions:
                    session.close()
    finally:
        sock.close()
    return 0


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@contextmanager
def _logged_to_stderr(quiet: bool) -> Iterator[None]:
    """The server's log on stderr while it serves: its errors (with their request ids) and, unless `quiet`, a
    line per request."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    logger = logging.getLogger("strata.server")
    level, logger.level = logger.level, logging.WARNING if quiet else logging.INFO
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def made_sessions(model, args: argparse.Namespace, wanted: int, sessions: list, reduce: bool) -> None:
    """Append `wanted` new sessions to `sessions`; with `reduce` (sessions that step together: a batch that does
    not fit is reduced, never failed) running out of memory after the first stops there, said in one line."""
    for _ in range(wanted):
        try:
            sessions.append(session_options.new_session(model, args))
        except OutOfMemory as error:
            if not reduce or not sessions:
                raise
            print(f"strata serve: {len(sessions)} of {wanted} sessions fit ({error}); serving {len(sessions)}",
                  file=sys.stderr)
            return
