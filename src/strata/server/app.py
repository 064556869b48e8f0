"""The OpenAI-compatible HTTP server over a pool of generation sessions (Starlette: a small, well-kept ASGI
toolkit whose streaming responses, disconnect handling and middleware are all the server needs; request bodies
are read by strata.server.body within stated limits and checked by strata.server.requests, which names every bad
field the way OpenAI's errors do)."""

from __future__ import annotations

import asyncio
import hmac
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

import strata
from strata.errors import FormatError, InvalidArgument, StrataError
from strata.generation import Session
from strata.generation.arguments import OptionRefused
from strata.generation.batcher import DECODE_STALL_SECONDS, Batcher
from strata.generation.constraints import can_mask, compile_grammar, warm
from strata.server.access import AccessLog, internal_error, log
from strata.server.answers import FINISH, Answers, data, usage
from strata.server.body import read_json
from strata.server.errors import BadRequest
from strata.server.metrics import Metrics
from strata.server.openapi import document
from strata.server.pool import QueueFull, SessionPool
from strata.server.requests import Call, check_model, parse_chat, parse_completion
from strata.server.runner import Event, Refused, Run
from strata.server.steering import ServedVectors
from strata.server.tokens import detokenize, tokenize
from strata.server.tools import ToolCallStream

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
    """The routes over `sessions` (one request at a time on each) serving the model called `model_name` (every
    request's `model` is answered by it); request bodies over `max_body_bytes` are refused unread. Up to `batch`
    sessions step together (None: all of them; 1, the default until the GPU box's measurement says otherwise: one
    answer computes at a time, docs/server.md): their engines become members of one Batcher
    (strata.generation.batcher) until close(), which gives them back; a request's answers (n choices, several
    prompts) run on up to `batch` sessions at once (strata.server.runner says how). Browsers on `cors_origins`
    ("*": any) may call it. `control_vectors` and `control_layers` are the ones the sessions were made with
    (Model.session's arguments): they steer every request, or a request picks its own of them
    (strata.server.steering). `decode_stall_seconds`: how long the decoding sessions' steps may wait behind new
    prompts' chunks (strata.generation.batcher.Batcher's)."""

    def __init__(self, sessions: Sequence[Session], model_name: str, *, api_key: str | None = None,
                 max_waiting: int = 16, max_body_bytes: int = MAX_BODY_BYTES, batch: int | None = 1,
                 cors_origins: Sequence[str] = (), control_vectors: Sequence[tuple[Any, float]] = (),
                 control_layers: tuple[int, int] | None = None, decode_stall_seconds: float = DECODE_STALL_SECONDS):
        if not sessions:
            raise InvalidArgument("the server needs at least one session")
        if max_body_bytes < 1:
            raise InvalidArgument(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        batch = len(sessions) if batch is None else batch
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise InvalidArgument(f"batch must be an integer >= 1 (or None: every session), got {batch!r}")
        self.pool = SessionPool(sessions, max_waiting, ServedVectors(control_vectors, control_layers))
        self.model_name, self.api_key, self.max_body_bytes = model_name, api_key, max_body_bytes
        self.cors_origins = list(cors_origins)
        self.codec = sessions[0].codec
        self.context = sessions[0].engine.context
        # A token stands for at most this many characters of text: a longer text cannot fit the context, which
        # is known without tokenizing it.
        tokens = getattr(self.codec, "tokens", None)
        self.max_token_chars = max(map(len, tokens)) if tokens else None
        token_bytes = getattr(self.codec, "token_bytes", None)
        self.token_bytes = token_bytes or (lambda token: self.codec.decode([token]).encode())
        self.answers = Answers(model_name, self.token_bytes)
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        self.batcher: Batcher | None = None
        self._engines = [s.engine for s in sessions]
        # the most sessions one request's answers (n choices, several prompts) run on at once: as many as step
        # together; at batch 1 its one session runs them in turn, as the one compute thread would anyway
        self.lanes = batch
        if batch == 1:
            self.executor = compute_thread(cpus)
        else:
            self.batcher = Batcher(cpus, max_batch=batch, decode_stall_seconds=decode_stall_seconds)
            for session in sessions:
                session.engine = self.batcher.member(session.engine)
            self.executor = ThreadPoolExecutor(len(sessions), thread_name_prefix="strata-run")
        self.metrics = Metrics()
        self.created = int(time.time())
        # structured output: the grammar engine's tokenizer made now, off the first such request's time
        self.masks = can_mask(self._engines[0])
        if self.masks:
            threading.Thread(target=warm, args=(self.codec,), name="strata-grammar-warm", daemon=True).start()

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
                  Route("/tokenize", self.tokenize, methods=["POST"]),
                  Route("/detokenize", self.detokenize, methods=["POST"]),
                  Route("/props", self.props, methods=["GET"]),
                  Route("/control-vectors", self.control_vectors, methods=["GET"]),
                  Route("/openapi.json", self.openapi, methods=["GET"]),
                  Route("/health", self.health, methods=["GET"]),
                  Route("/metrics", self.metrics_text, methods=["GET"])]
        middleware = [Middleware(AccessLog)]
        if self.cors_origins:  # answers preflights itself, before any key is asked for (browsers send none there)
            middleware.append(Middleware(CORSMiddleware, allow_origins=self.cors_origins,
                                         allow_methods=["GET", "POST"], allow_headers=["*"],
                                         expose_headers=["X-Request-Id"]))
        return Starlette(routes=routes, middleware=middleware,
                         exception_handlers={404: self._not_found, 405: self._not_allowed})

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
        """The model by its id: the one served; another id is not found here (generation answers any)."""
        if (refused := self._refused(request)) is not None:
            return refused
        if request.path_params["model"] != self.model_name:
            return self._answer(BadRequest(f"the model {request.path_params['model']!r:.80} is not served here; "
                                           f"this server serves {self.model_name!r}", "model", "model_not_found",
                                           status=404))
        return JSONResponse(self._model_card())

    def _model_card(self) -> dict[str, Any]:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "strata"}

    async def tokenize(self, request: Request) -> Response:
        return await self._tokens(request, lambda body: tokenize(self.codec, self.token_bytes, body))

    async def detokenize(self, request: Request) -> Response:
        return await self._tokens(request, lambda body: detokenize(self.codec, body))

    async def _tokens(self, request: Request, work: Callable[[Any], dict[str, Any]]) -> Response:
        try:
            self._authorize(request)
            body = await self._body(request)
            return JSONResponse(await _off_the_loop(lambda: work(read_json(body))))
        except BadRequest as error:
            return self._answer(error)

    async def props(self, request: Request) -> Response:
        """llama-server's /props: the context, the slots (sessions), the default sampling, the chat template."""
        if (refused := self._refused(request)) is not None:
            return refused
        defaults = {"n_ctx": self.context, "params": {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                                                      "repeat_penalty": 1.0, "frequency_penalty": 0.0,
                                                      "presence_penalty": 0.0, "n_predict": -1, "seed": -1}}
        return JSONResponse({"default_generation_settings": defaults, "total_slots": len(self.pool.sessions),
                             "model_alias": self.model_name, "model_path": self.model_name,
                             "chat_template": getattr(self.codec, "chat_template", None) or "",
                             "modalities": {"vision": False, "audio": False},
                             "build_info": f"strata {strata.__version__}"})

    async def control_vectors(self, request: Request) -> Response:
        """The control vectors a request may name in its `control_vectors` (llama-server's /lora-adapters, for
        steering): each one's id, file name and the scale it steers a request that names none at."""
        if (refused := self._refused(request)) is not None:
            return refused
        return JSONResponse(self.pool.vectors.listing())

    async def openapi(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        return JSONResponse(document())

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "sessions": len(self.pool.sessions), "busy": self.pool.busy,
                             "waiting": self.pool.waiting})

    async def metrics_text(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        return PlainTextResponse(self.metrics.text(self.pool, self.batcher), media_type="text/plain; version=0.0.4")

    # ----------------------------------------------------------------------------------------- generation

    async def _generate(self, request: Request, endpoint: str, parse) -> Response:
        arrived = time.perf_counter()
        try:
            self._authorize(request)
            body = await self._body(request)
            # reading, rendering and tokenizing take time in proportion to the body: off the event loop, so that
            # /health and the other streams go on meanwhile
            call, prompts = await _off_the_loop(self._prepare, body, parse)
            self.metrics.arrived(self.pool.waiting)
            session = await self.pool.take(prompts[0], call.control_vectors)
        except BadRequest as error:
            return self._refuse(endpoint, error)
        except QueueFull as error:
            return self._refuse(endpoint, BadRequest(str(error), code="rate_limit_exceeded", status=429))
        run = Run(self.pool, session, call, prompts, self.executor, lanes=self.lanes, arrived=arrived)
        head = self.answers.head(call)
        watcher = asyncio.create_task(self._watch(request, run))
        events = run.events()
        if call.stream:
            try:  # the prompt runs before the first event: a request or model that fails there gets its status
                first = await anext(events, None)
            except BaseException as error:
                watcher.cancel()
                await self._let_go(run, request)
                if isinstance(error, (Refused, StrataError)):
                    return self._refuse(endpoint, self._failure(error, request))
                raise
            watcher.cancel()  # from here the streaming response notices a client that hangs up
            return StreamingResponse(self._events(run, head, endpoint, events, first, request),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        try:
            got = [event async for event in events]
        except (Refused, StrataError) as error:
            return self._refuse(endpoint, self._failure(error, request))
        finally:
            watcher.cancel()
            await self._let_go(run, request)
        self.metrics.answered(endpoint, 200 if run.whole else CLIENT_GONE, run.stats)
        pieces: list[list] = [[] for _ in range(call.answers)]
        for event in got:
            if event.piece is not None:
                pieces[event.answer].append(event.piece)
        return JSONResponse(self.answers.whole(call, head, pieces, run.finished, run.stats))

    async def _events(self, run: Run, head: dict[str, Any], endpoint: str, events: AsyncIterator[Event],
                      first: Event | None, request: Request) -> AsyncIterator[str]:
        call, answers = run.call, self.answers
        status = CLIENT_GONE  # until the last event is out
        tools = [ToolCallStream() for _ in range(call.answers)] if call.kind == "chat" and call.tools else None
        try:
            if call.kind == "chat":
                for index in range(call.answers):
                    yield answers.event(head, call, index, {"role": "assistant", "content": ""})
            async for event in _chained(first, events):
                if event.piece is not None:
                    text = tools[event.answer].push(event.piece.text) if tools else event.piece.text
                    yield answers.event(head, call, event.answer, answers.delta(call, text),
                                        logprobs=answers.logprobs(call, [event.piece]))
                    continue
                finish = FINISH[event.stats.finish_reason]
                if tools:
                    rest, calls = tools[event.answer].finish()
                    if rest:
                        yield answers.event(head, call, event.answer, {"content": rest})
                    if calls:
                        finish = "tool_calls"
                        yield answers.event(head, call, event.answer,
                                            {"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]})
                yield answers.event(head, call, event.answer, {}, finish=finish)
            if call.include_usage:
                yield data({**head, "choices": [], "usage": usage(run.stats)})
            status = 200
        except (Refused, StrataError) as error:  # the model failed after the answer began, its 200 sent:
            failure = self._failure(error, request)  # the last event says so
            status = failure.status
            yield data(failure.body())
        except Exception:
            request_id = request.state.request_id
            log.exception("request %s (%s) failed while streaming", request_id, endpoint)
            status = 500
            yield data(internal_error(request_id).body())
        finally:
            await self._let_go(run, request)
            self.metrics.answered(endpoint, status, run.stats)
        yield "data: [DONE]\n\n"

    async def _let_go(self, run: Run, request: Request) -> None:
        """Stop the run and hand its sessions back, even where the client is gone; the request's counts go to its
        log line."""
        with anyio.CancelScope(shield=True):
            await run.finish()
        self.metrics.timed(run.first_token, run.between)
        stats = run.stats
        request.state.tokens = (stats.prompt_tokens, stats.generated_tokens)

    def _refuse(self, endpoint: str, error: BadRequest) -> Response:
        self.metrics.answered(endpoint, error.status)
        return self._answer(error)

    def _answer(self, error: BadRequest) -> Response:
        return JSONResponse(error.body(), status_code=error.status, headers=self._headers(error))

    @staticmethod
    def _failure(error: Exception, request: Request) -> BadRequest:
        """A run's error as an answer: refused arguments are the client's (400, naming the field where the session
        did), as is a grammar the grammar engine cannot follow further; the rest the model's or the engine's (500,
        logged: NaN logits, a CUDA error, ...)."""
        if isinstance(error, Refused):
            return BadRequest(str(error), getattr(error.error, "option", None), code="invalid_value")
        if isinstance(error, OptionRefused):  # a grammar the grammar engine could not follow to its end
            return BadRequest(str(error), error.option, code="invalid_value")
        log.error("request %s: the model failed: %s", request.state.request_id, error)
        return BadRequest(f"the model failed: {error}", code="model_error", status=500)

    @staticmethod
    async def _watch(request: Request, run: Run) -> None:
        """A client that hangs up on a whole answer, or before a stream's first event, cancels it at the next token
        boundary."""
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL_SECONDS)
        run.cancelled.set()

    # ---------------------------------------------------------------------------------------------- parts

    def _prepare(self, body: bytes, parse) -> tuple[Call, list[list[int]]]:
        """The request's call and its prompts' ids (BadRequest names what is wrong); runs on a worker thread."""
        fields = read_json(body)
        call = self._compiled(parse(fields))
        call = replace(call, control_vectors=self.pool.vectors.key(call.control_vectors))
        check_model(fields.get("model"))
        if call.kind == "chat":
            return call, [self._chat_ids(call)]
        return call, [self._prompt_ids(prompt) for prompt in call.prompts]

    def _compiled(self, call: Call) -> Call:
        """The call with its constraint compiled against the model's tokenizer (before it waits for a session): a
        schema or grammar that cannot be enforced is refused naming the request's field and what it cannot take;
        an engine whose sampler takes no token mask refuses any."""
        asked = call.constraint
        if asked is None:
            return call
        if not self.masks:
            raise BadRequest(f"{asked.field}: this server's engine cannot hold an answer to a grammar (its sampler "
                             "takes no token mask; the GPU and reference engines' samplers do)", asked.field,
                             "unsupported_parameter")
        if call.sampling.get("ignore_eos"):
            raise BadRequest(f"'ignore_eos' cannot go with '{asked.field}': the grammar says where the answer ends",
                             "ignore_eos", "invalid_value")
        try:
            return replace(call, grammar=compile_grammar(self.codec, asked.kind, asked.source, asked.field))
        except StrataError as error:
            raise BadRequest(str(error), asked.field, "invalid_value") from None

    def _chat_ids(self, call: Call) -> list[int]:
        if not getattr(self.codec, "chat_template", None):
            raise BadRequest("the model has no chat template: start the server with --chat-template or "
                             "--chat-template-file (/v1/completions takes a prompt as it is)", "messages",
                             "chat_template_missing")
        # the parsed messages' text, which the conversation renders verbatim: a lower bound of its length
        self._check_length(sum(len(m["content"]) for m in call.messages), "messages")
        try:
            ids = self.pool.sessions[0].chat_ids(call.messages, call.template_options)  # messages as text
        except (InvalidArgument, FormatError) as error:
            raise BadRequest(str(error), "messages", "invalid_value") from None
        return self._fitting(ids, "messages")

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            self._check_length(len(prompt), "prompt")
            return self._fitting(self.codec.encode(prompt), "prompt")
        vocab = len(getattr(self.codec, "tokens", ())) or None
        if vocab is not None and not all(0 <= t < vocab for t in prompt):
            raise BadRequest(f"prompt token ids must lie in 0..{vocab - 1}", "prompt", "invalid_value")
        return self._fitting(list(prompt), "prompt")

    def _fitting(self, ids: list[int], field: str) -> list[int]:
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

    # ------------------------------------------------------------------------------------- requests, errors

    def _authorize(self, request: Request) -> None:
        """The key, where one is set, as `Authorization: Bearer KEY` (the scheme in any case, as RFC 9110 has it;
        compared in constant time)."""
        if self.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise BadRequest("a valid API key is required (Authorization: Bearer KEY)", code="invalid_api_key",
                             status=401)

    def _refused(self, request: Request) -> Response | None:
        try:
            self._authorize(request)
        except BadRequest as error:
            return self._answer(error)
        return None

    async def _body(self, request: Request) -> bytes:
        """The request's body, refused (413) as soon as it is known to be over `max_body_bytes`; its size (what was
        read of it) goes to request.state.body_bytes."""
        too_large = BadRequest(f"the request body is over {self.max_body_bytes} bytes", code="request_too_large",
                               status=413)
        declared = request.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise too_large
        body = bytearray()
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > self.max_body_bytes:
                    raise too_large
        finally:
            request.state.body_bytes = len(body)
        return bytes(body)

    @staticmethod
    def _headers(error: BadRequest) -> dict[str, str]:
        return {401: {"WWW-Authenticate": "Bearer"}, 429: {"Retry-After": "1"}}.get(error.status, {})

    async def _not_found(self, request: Request, exc: Exception) -> Response:
        return self._answer(BadRequest(f"no route {request.url.path[:120]}", code="not_found", status=404))

    async def _not_allowed(self, request: Request, exc: Exception) -> Response:
        return self._answer(BadRequest(f"{request.method} is not allowed on {request.url.path[:120]}",
                                       code="method_not_allowed", status=405))


async def _off_the_loop(work: Callable[..., Any], *args: Any) -> Any:
    """work(*args) on a worker thread. A BadRequest it raises crosses back as a value, without its traceback, and
    is raised here: raised across the thread's future it formed a cycle (the exception, its traceback, the frame
    awaiting the future, the future) that kept the request's parsed body alive until the cyclic collector ran, while
    the allocations of the requests after it landed among the body's and kept that memory from being given back."""
    def caught() -> tuple[Any, BadRequest | None]:
        try:
            return work(*args), None
        except BadRequest as error:
            return None, error.with_traceback(None)

    value, refused = await anyio.to_thread.run_sync(caught)
    if refused is None:
        return value
    try:
        raise refused
    finally:
        del refused  # this frame, in the exception's traceback, would hold it: a cycle again


async def _chained(first: Event | None, rest: AsyncIterator[Event]) -> AsyncIterator[Event]:
    if first is not None:
        yield first
    async for event in rest:
        yield event
