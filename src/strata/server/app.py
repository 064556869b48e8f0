"""The OpenAI-compatible HTTP server over a pool of generation sessions (Starlette: a small, well-kept ASGI
toolkit whose streaming responses, disconnect handling and lifespan are all the server needs; request bodies
are checked by strata.server.requests, which names every bad field the way OpenAI's errors do)."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from strata.errors import FormatError, InvalidArgument, StrataError
from strata.generation import Piece, Session, Stats
from strata.server.metrics import Metrics
from strata.server.pool import QueueFull, SessionPool
from strata.server.requests import BadRequest, Call, parse_chat, parse_completion
from strata.server.runner import Run
from strata.server.tools import ToolCallStream, split_tool_calls

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length", "interrupted": "stop",
          "cancelled": "stop", "error": "stop"}
CLIENT_GONE = 499  # the status nginx logs for a client that closed the connection first
DISCONNECT_POLL_SECONDS = 0.05


def compute_thread(cpus: set[int] | None) -> ThreadPoolExecutor:
    """The one thread every generation runs on: batch 1, one request computes at a time (the sessions of a model
    share its CPU expert pool, which takes one layer at a time). It runs on `cpus`: where the thread that loaded
    the model runs, which the pool pinned to the core its workers leave free, and the doorbell is answered there."""
    def pin() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
    return ThreadPoolExecutor(1, thread_name_prefix="strata-generate", initializer=pin)


class Server:
    """The routes over `sessions` (one request at a time on each) serving the model called `model_name`."""

    def __init__(self, sessions: Sequence[Session], model_name: str, *, api_key: str | None = None,
                 max_waiting: int = 16):
        if not sessions:
            raise InvalidArgument("the server needs at least one session")
        self.pool = SessionPool(sessions, max_waiting)
        self.model_name, self.api_key = model_name, api_key
        self.codec = sessions[0].codec
        self.context = sessions[0].engine.context
        self.executor = compute_thread(os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None)
        self.metrics = Metrics()
        self.created = int(time.time())

    def close(self) -> None:
        """Let the compute thread go once the requests it has are done."""
        self.executor.shutdown(wait=True)

    def app(self) -> Starlette:
        routes = [Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                  Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/v1/models", self.models, methods=["GET"]),
                  Route("/health", self.health, methods=["GET"]),
                  Route("/metrics", self.metrics_text, methods=["GET"])]
        return Starlette(routes=routes, exception_handlers={404: self._not_found, 405: self._not_allowed,
                                                            Exception: self._internal})

    # ---------------------------------------------------------------------------------------------- routes

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, "/v1/chat/completions", parse_chat)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "/v1/completions", parse_completion)

    async def models(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        return JSONResponse({"object": "list", "data": [{"id": self.model_name, "object": "model",
                                                         "created": self.created, "owned_by": "strata"}]})

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "sessions": len(self.pool.sessions), "busy": self.pool.busy,
                             "waiting": self.pool.waiting})

    async def metrics_text(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        return PlainTextResponse(self.metrics.text(self.pool), media_type="text/plain; version=0.0.4")

    # ----------------------------------------------------------------------------------------- generation

    async def _generate(self, request: Request, endpoint: str, parse) -> Response:
        try:
            self._authorize(request)
            call = parse(await self._json(request))
            ids = self._prompt_ids(call)
            lease = self.pool.lease(ids)
            session = await lease.__aenter__()
        except BadRequest as error:
            self.metrics.answered(endpoint, error.status)
            return JSONResponse(error.body(), status_code=error.status, headers=self._headers(error))
        except QueueFull as error:
            self.metrics.answered(endpoint, 429)
            return JSONResponse(BadRequest(str(error), code="rate_limit_exceeded", status=429).body(),
                                status_code=429, headers={"Retry-After": "1"})
        run = Run(session, call, ids, self.executor)
        ident = ("chatcmpl-" if call.kind == "chat" else "cmpl-") + uuid.uuid4().hex
        if call.stream:
            return StreamingResponse(self._events(run, lease, ident, endpoint), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        watcher = asyncio.create_task(self._watch(request, run))
        try:
            pieces = [piece async for piece in run.pieces()]
        except StrataError as error:
            status = 400 if isinstance(error, (InvalidArgument, FormatError)) else 500
            self.metrics.answered(endpoint, status)
            return JSONResponse(BadRequest(str(error), status=status).body(), status_code=status)
        finally:
            watcher.cancel()
            with anyio.CancelScope(shield=True):
                await run.finish()
                await lease.__aexit__(None, None, None)
        status = CLIENT_GONE if run.stats.finish_reason == "cancelled" else 200
        self.metrics.answered(endpoint, status, run.stats)
        return JSONResponse(self._whole(call, ident, pieces, run.stats))

    async def _events(self, run: Run, lease, ident: str, endpoint: str) -> AsyncIterator[str]:
        call = run.call
        status = CLIENT_GONE  # until the last event is out
        tools = ToolCallStream() if call.kind == "chat" and call.tools else None
        try:
            if call.kind == "chat":
                yield self._event(ident, call, {"role": "assistant", "content": ""})
            async for piece in run.pieces():
                text = tools.push(piece.text) if tools is not None else piece.text
                yield self._event(ident, call, self._delta(call, text), logprobs=self._logprobs(call, [piece]))
            finish = FINISH[run.stats.finish_reason]
            if tools is not None:
                rest, calls = tools.finish()
                if rest:
                    yield self._event(ident, call, {"content": rest})
                if calls:
                    finish = "tool_calls"
                    yield self._event(ident, call, {"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]})
            yield self._event(ident, call, {}, finish=finish)
            if call.include_usage:
                yield self._data({**self._head(ident, call, chunk=True), "choices": [],
                                  "usage": self._usage(run.stats)})
            status = 200
        except StrataError as error:
            status = 500
            yield self._data(BadRequest(str(error), status=500).body())
        finally:
            with anyio.CancelScope(shield=True):  # the client may be gone: still let go of the session in order
                await run.finish()
                await lease.__aexit__(None, None, None)
            self.metrics.answered(endpoint, status, run.stats)
        yield "data: [DONE]\n\n"

    @staticmethod
    async def _watch(request: Request, run: Run) -> None:
        """A client that hangs up on a whole (not streamed) answer cancels it at the next token boundary."""
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL_SECONDS)
        run.cancelled.set()

    # ---------------------------------------------------------------------------------------------- parts

    def _prompt_ids(self, call: Call) -> list[int]:
        if call.kind == "chat":
            try:
                ids = self.pool.sessions[0].chat_ids(call.messages, call.template_options)  # messages as text
            except (InvalidArgument, FormatError) as error:
                raise BadRequest(str(error), "messages", "invalid_value") from None
        elif isinstance(call.prompt, str):
            ids = self.codec.encode(call.prompt)
        else:
            ids = list(call.prompt)
            vocab = len(getattr(self.codec, "tokens", ())) or None
            if vocab is not None and not all(0 <= t < vocab for t in ids):
                raise BadRequest(f"prompt token ids must lie in 0..{vocab - 1}", "prompt", "invalid_value")
        if not ids:
            raise BadRequest("the prompt is empty", "prompt" if call.kind == "completion" else "messages",
                             "invalid_value")
        if len(ids) >= self.context:
            raise BadRequest(f"the prompt is {len(ids)} tokens; the context holds {self.context} (at least one more "
                             "for the answer)", "messages" if call.kind == "chat" else "prompt",
                             "context_length_exceeded")
        return ids

    def _whole(self, call: Call, ident: str, pieces: list[Piece], stats: Stats) -> dict[str, Any]:
        text = "".join(p.text for p in pieces)
        finish = FINISH[stats.finish_reason]
        logprobs = self._logprobs(call, pieces)
        if call.kind == "chat":
            content, calls = split_tool_calls(text) if call.tools else (text, [])
            message: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
            if calls:
                message["tool_calls"], finish = calls, "tool_calls"
            choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return {**self._head(ident, call, chunk=False), "choices": [choice], "usage": self._usage(stats)}

    def _head(self, ident: str, call: Call, chunk: bool) -> dict[str, Any]:
        kind = "chat.completion" if call.kind == "chat" else "text_completion"
        return {"id": ident, "object": kind + (".chunk" if chunk and call.kind == "chat" else ""),
                "created": int(time.time()), "model": self.model_name}

    def _delta(self, call: Call, text: str) -> dict[str, Any]:
        return {"content": text} if call.kind == "chat" else {"text": text}

    def _event(self, ident: str, call: Call, delta: dict[str, Any], finish: str | None = None,
               logprobs: Any = None) -> str:
        if call.kind == "chat":
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta.get("text", ""), "logprobs": logprobs, "finish_reason": finish}
        return self._data({**self._head(ident, call, chunk=True), "choices": [choice]})

    @staticmethod
    def _data(payload: dict[str, Any]) -> str:
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def _logprobs(self, call: Call, pieces: list[Piece]) -> Any:
        if call.logprobs is None:
            return None
        text = {t: self.codec.decode([t]) for p in pieces for t in (p.token, *(t for t, _ in p.top_logprobs))}
        if call.kind == "chat":
            def entry(token: int, logprob: float) -> dict[str, Any]:
                return {"token": text[token], "logprob": logprob, "bytes": list(text[token].encode())}
            return {"content": [{**entry(p.token, p.logprob),
                                 "top_logprobs": [entry(t, lp) for t, lp in p.top_logprobs]} for p in pieces]}
        return {"tokens": [text[p.token] for p in pieces], "token_logprobs": [p.logprob for p in pieces],
                "top_logprobs": [{text[t]: lp for t, lp in p.top_logprobs} for p in pieces]}

    @staticmethod
    def _usage(stats: Stats | None) -> dict[str, Any]:
        stats = stats or Stats()
        return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated_tokens,
                "total_tokens": stats.prompt_tokens + stats.generated_tokens,
                "prompt_tokens_details": {"cached_tokens": stats.cached_tokens}}

    # ------------------------------------------------------------------------------------- requests, errors

    def _authorize(self, request: Request) -> None:
        if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
            raise BadRequest("a valid API key is required (Authorization: Bearer KEY)", code="invalid_api_key",
                             status=401)

    def _refused(self, request: Request) -> Response | None:
        try:
            self._authorize(request)
        except BadRequest as error:
            return JSONResponse(error.body(), status_code=error.status, headers=self._headers(error))
        return None

    @staticmethod
    async def _json(request: Request) -> Any:
        try:
            return json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise BadRequest(f"the request body is not valid JSON ({error})", code="invalid_json") from None

    @staticmethod
    def _headers(error: BadRequest) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"} if error.status == 401 else {}

    async def _not_found(self, request: Request, exc: Exception) -> Response:
        return JSONResponse(BadRequest(f"no route {request.url.path}", code="not_found", status=404).body(), 404)

    async def _not_allowed(self, request: Request, exc: Exception) -> Response:
        return JSONResponse(BadRequest(f"{request.method} is not allowed on {request.url.path}",
                                       code="method_not_allowed", status=405).body(), 405)

    async def _internal(self, request: Request, exc: Exception) -> Response:
        return JSONResponse(BadRequest(f"internal error: {type(exc).__name__}: {exc}", code="internal_error",
                                       status=500).body(), 500)
