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
from strata.generation.batcher import Batcher
from strata.server.metrics import Metrics
from strata.server.pool import QueueFull, SessionPool
from strata.server.requests import BadRequest, Call, check_model, parse_chat, parse_completion
from strata.server.runner import Refused, Run
from strata.server.tools import ToolCallStream, split_tool_calls

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length", "interrupted": "stop",
          "cancelled": "stop", "error": "stop"}
CLIENT_GONE = 499  # the status nginx logs for a client that closed the connection first
DISCONNECT_POLL_SECONDS = 0.05
MAX_BODY_BYTES = 8 << 20  # a request body larger is refused (413) before it is read whole


def compute_thread(cpus: set[int] | None) -> ThreadPoolExecutor:
    """The one thread every generation runs on at batch 1: one request computes at a time (the sessions of a model
    share its CPU expert pool, which takes one layer at a time). It runs on `cpus`: where the thread that loaded
    the model runs, which the pool pinned to the core its workers leave free, and the doorbell is answered there.
    At a larger batch the Batcher's thread is that thread, and each generation runs in a worker of its own."""
    def pin() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
    return ThreadPoolExecutor(1, thread_name_prefix="strata-generate", initializer=pin)


class Server:
    """The routes over `sessions` (one request at a time on each) serving the model called `model_name`; request
    bodies over `max_body_bytes` are refused unread. Up to `batch` sessions step together (None: all of them;
    1, the default: one request computes at a time, which batching does not yet beat: docs/server.md): their
    engines become members of one Batcher (strata.generation.batcher) until close(), which gives them back."""

    def __init__(self, sessions: Sequence[Session], model_name: str, *, api_key: str | None = None,
                 max_waiting: int = 16, max_body_bytes: int = MAX_BODY_BYTES, batch: int | None = 1):
        if not sessions:
            raise InvalidArgument("the server needs at least one session")
        if max_body_bytes < 1:
            raise InvalidArgument(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        batch = len(sessions) if batch is None else batch
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise InvalidArgument(f"batch must be an integer >= 1 (or None: every session), got {batch!r}")
        self.pool = SessionPool(sessions, max_waiting)
        self.model_name, self.api_key, self.max_body_bytes = model_name, api_key, max_body_bytes
        self.codec = sessions[0].codec
        self.context = sessions[0].engine.context
        # A token stands for at most this many characters of text: a longer text cannot fit the context, which
        # is known without tokenizing it.
        tokens = getattr(self.codec, "tokens", None)
        self.max_token_chars = max(map(len, tokens)) if tokens else None
        token_bytes = getattr(self.codec, "token_bytes", None)
        self.token_bytes = token_bytes or (lambda token: self.codec.decode([token]).encode())
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        self.batcher: Batcher | None = None
        self._engines = [s.engine for s in sessions]
        if batch == 1:
            self.executor = compute_thread(cpus)
        else:
            self.batcher = Batcher(cpus, max_batch=batch)
            for session in sessions:
                session.engine = self.batcher.member(session.engine)
            self.executor = ThreadPoolExecutor(len(sessions), thread_name_prefix="strata-run")
        self.metrics = Metrics()
        self.created = int(time.time())

    def close(self) -> None:
        """Let the compute thread go once the requests it has are done; the sessions get their engines back."""
        self.executor.shutdown(wait=True)
        if self.batcher is not None:
            self.batcher.close()
            for session, engine in zip(self.pool.sessions, self._engines):
                session.engine = engine

    def app(self) -> Starlette:
        routes = [Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                  Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/v1/models", self.models, methods=["GET"]),
                  Route("/v1/models/{model:path}", self.model, methods=["GET"]),
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
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        try:
            check_model({"model": request.path_params["model"]}, self.model_name)
        except BadRequest as error:
            return JSONResponse(error.body(), status_code=error.status)
        return JSONResponse(self._model_card())

    def _model_card(self) -> dict[str, Any]:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "strata"}

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "sessions": len(self.pool.sessions), "busy": self.pool.busy,
                             "waiting": self.pool.waiting})

    async def metrics_text(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        return PlainTextResponse(self.metrics.text(self.pool, self.batcher), media_type="text/plain; version=0.0.4")

    # ----------------------------------------------------------------------------------------- generation

    async def _generate(self, request: Request, endpoint: str, parse) -> Response:
        try:
            self._authorize(request)
            body = await self._body(request)
            # parsing, rendering and tokenizing take time in proportion to the body: off the event loop, so that
            # /health and the other streams go on meanwhile
            call, ids = await anyio.to_thread.run_sync(self._prepare, body, parse)
            lease = self.pool.lease(ids)
            session = await lease.__aenter__()
        except BadRequest as error:
            return self._refuse(endpoint, error)
        except QueueFull as error:
            return self._refuse(endpoint, BadRequest(str(error), code="rate_limit_exceeded", status=429))
        run = Run(session, call, ids, self.executor, active=session.engine.active if self.batcher else None)
        head = self._head(call)
        watcher = asyncio.create_task(self._watch(request, run))
        if call.stream:
            pieces = run.pieces()
            try:  # the prompt runs before the first event: a request or model that fails there gets its status
                first = await anext(pieces, None)
            except (Refused, StrataError) as error:
                await self._let_go(run, lease)
                return self._refuse(endpoint, self._failure(error))
            finally:
                watcher.cancel()  # from here the streaming response notices a client that hangs up
            return StreamingResponse(self._events(run, lease, head, endpoint, pieces, first),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        try:
            pieces = [piece async for piece in run.pieces()]
        except (Refused, StrataError) as error:
            return self._refuse(endpoint, self._failure(error))
        finally:
            watcher.cancel()
            await self._let_go(run, lease)
        status = CLIENT_GONE if run.stats.finish_reason == "cancelled" else 200
        self.metrics.answered(endpoint, status, run.stats)
        return JSONResponse(self._whole(call, head, pieces, run.stats))

    async def _events(self, run: Run, lease, head: dict[str, Any], endpoint: str, pieces: AsyncIterator[Piece],
                      first: Piece | None) -> AsyncIterator[str]:
        call = run.call
        status = CLIENT_GONE  # until the last event is out
        tools = ToolCallStream() if call.kind == "chat" and call.tools else None
        try:
            if call.kind == "chat":
                yield self._event(head, call, {"role": "assistant", "content": ""})
            async for piece in _chained(first, pieces):
                text = tools.push(piece.text) if tools is not None else piece.text
                yield self._event(head, call, self._delta(call, text), logprobs=self._logprobs(call, [piece]))
            finish = FINISH[run.stats.finish_reason]
            if tools is not None:
                rest, calls = tools.finish()
                if rest:
                    yield self._event(head, call, {"content": rest})
                if calls:
                    finish = "tool_calls"
                    yield self._event(head, call, {"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]})
            yield self._event(head, call, {}, finish=finish)
            if call.include_usage:
                yield self._data({**head, "choices": [], "usage": self._usage(run.stats)})
            status = 200
        except StrataError as error:  # the model failed after the answer began, its 200 sent: the last event says so
            status = 500
            yield self._data(self._failure(error).body())
        finally:
            await self._let_go(run, lease)
            self.metrics.answered(endpoint, status, run.stats)
        yield "data: [DONE]\n\n"

    @staticmethod
    async def _let_go(run: Run, lease) -> None:
        """Stop the run and hand its session back, in order, even where the client is gone."""
        with anyio.CancelScope(shield=True):
            await run.finish()
            await lease.__aexit__(None, None, None)

    def _refuse(self, endpoint: str, error: BadRequest) -> Response:
        self.metrics.answered(endpoint, error.status)
        return JSONResponse(error.body(), status_code=error.status, headers=self._headers(error))

    @staticmethod
    def _failure(error: Exception) -> BadRequest:
        """A run's error as an answer: refused arguments are the client's (400), the rest the model's or the
        engine's (500: NaN logits, a CUDA error, ...)."""
        if isinstance(error, Refused):
            return BadRequest(str(error), code="invalid_value")
        return BadRequest(f"the model failed: {error}", code="model_error", status=500)

    @staticmethod
    async def _watch(request: Request, run: Run) -> None:
        """A client that hangs up on a whole answer, or before a stream's first event, cancels it at the next token
        boundary."""
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL_SECONDS)
        run.cancelled.set()

    # ---------------------------------------------------------------------------------------------- parts

    def _prepare(self, body: bytes, parse) -> tuple[Call, list[int]]:
        """The request's call and its prompt's ids (BadRequest names what is wrong); runs on a worker thread."""
        try:
            fields = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise BadRequest(f"the request body is not valid JSON ({error})", code="invalid_json") from None
        call = parse(fields)
        check_model(fields, self.model_name)
        return call, self._prompt_ids(call)

    def _prompt_ids(self, call: Call) -> list[int]:
        field = "messages" if call.kind == "chat" else "prompt"
        if call.kind == "chat":
            if not getattr(self.codec, "chat_template", None):
                raise BadRequest("the model has no chat template: start the server with --chat-template or "
                                 "--chat-template-file (/v1/completions takes a prompt as it is)", "messages",
                                 "chat_template_missing")
            # the parsed messages' text, which the conversation renders verbatim: a lower bound of its length
            self._check_length(sum(len(m["content"]) for m in call.messages), field)
            try:
                ids = self.pool.sessions[0].chat_ids(call.messages, call.template_options)  # messages as text
            except (InvalidArgument, FormatError) as error:
                raise BadRequest(str(error), "messages", "invalid_value") from None
        elif isinstance(call.prompt, str):
            self._check_length(len(call.prompt), field)
            ids = self.codec.encode(call.prompt)
        else:
            ids = list(call.prompt)
            vocab = len(getattr(self.codec, "tokens", ())) or None
            if vocab is not None and not all(0 <= t < vocab for t in ids):
                raise BadRequest(f"prompt token ids must lie in 0..{vocab - 1}", "prompt", "invalid_value")
        if not ids:
            raise BadRequest("the prompt is empty", field, "invalid_value")
        if len(ids) >= self.context:
            raise BadRequest(f"the prompt is {len(ids)} tokens; the context holds {self.context} (at least one more "
                             "for the answer)", field, "context_length_exceeded")
        return ids

    def _check_length(self, chars: int, field: str) -> None:
        """Refuse, before tokenizing it, a text of `chars` characters too long to fit the context as any tokens."""
        if self.max_token_chars is not None and chars >= self.max_token_chars * self.context:
            raise BadRequest(f"the prompt is {chars} characters; the context holds {self.context} tokens of at "
                             f"most {self.max_token_chars} characters each", field, "context_length_exceeded")

    def _whole(self, call: Call, head: dict[str, Any], pieces: list[Piece], stats: Stats) -> dict[str, Any]:
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
        return {**head, "choices": [choice], "usage": self._usage(stats)}

    def _head(self, call: Call) -> dict[str, Any]:
        """What every chunk of an answer (or the whole answer) starts with: one id, one time of creation."""
        kind = "chat.completion" if call.kind == "chat" else "text_completion"
        ident = ("chatcmpl-" if call.kind == "chat" else "cmpl-") + uuid.uuid4().hex
        return {"id": ident, "object": kind + (".chunk" if call.stream and call.kind == "chat" else ""),
                "created": int(time.time()), "model": self.model_name}

    def _delta(self, call: Call, text: str) -> dict[str, Any]:
        return {"content": text} if call.kind == "chat" else {"text": text}

    def _event(self, head: dict[str, Any], call: Call, delta: dict[str, Any], finish: str | None = None,
               logprobs: Any = None) -> str:
        if call.kind == "chat":
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta.get("text", ""), "logprobs": logprobs, "finish_reason": finish}
        return self._data({**head, "choices": [choice]})

    @staticmethod
    def _data(payload: dict[str, Any]) -> str:
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def _logprobs(self, call: Call, pieces: list[Piece]) -> Any:
        if call.logprobs is None:
            return None
        raw = {t: self.token_bytes(t) for p in pieces for t in (p.token, *(t for t, _ in p.top_logprobs))}
        text = {t: _token_text(b) for t, b in raw.items()}
        if call.kind == "chat":
            def entry(token: int, logprob: float) -> dict[str, Any]:
                return {"token": text[token], "logprob": logprob, "bytes": list(raw[token])}
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

    async def _body(self, request: Request) -> bytes:
        """The request's body, refused (413) as soon as it is known to be over `max_body_bytes`."""
        too_large = BadRequest(f"the request body is over {self.max_body_bytes} bytes", code="request_too_large",
                               status=413)
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            raise too_large
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.max_body_bytes:
                raise too_large
        return bytes(body)

    @staticmethod
    def _headers(error: BadRequest) -> dict[str, str]:
        return {401: {"WWW-Authenticate": "Bearer"}, 429: {"Retry-After": "1"}}.get(error.status, {})

    async def _not_found(self, request: Request, exc: Exception) -> Response:
        return JSONResponse(BadRequest(f"no route {request.url.path}", code="not_found", status=404).body(), 404)

    async def _not_allowed(self, request: Request, exc: Exception) -> Response:
        return JSONResponse(BadRequest(f"{request.method} is not allowed on {request.url.path}",
                                       code="method_not_allowed", status=405).body(), 405)

    async def _internal(self, request: Request, exc: Exception) -> Response:
        return JSONResponse(BadRequest(f"internal error: {type(exc).__name__}: {exc}", code="internal_error",
                                       status=500).body(), 500)


async def _chained(first: Piece | None, rest: AsyncIterator[Piece]) -> AsyncIterator[Piece]:
    if first is not None:
        yield first
    async for piece in rest:
        yield piece


def _token_text(raw: bytes) -> str:
    """A token's text in logprobs: its UTF-8, or where its bytes are not whole characters OpenAI's spelling of
    them (bytes:\\xe2\\x80), so that two tokens never read alike."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
