"""One request's generations on its session, in a worker thread (an engine step blocks), with what they produce
handed to the event loop as it comes; where the session's engine is a Batcher's member, it is active for the run,
and its pieces are handed over as the engine call for the next token starts (Member.before_compute), so that the
event loop writes them while the engine computes, not between two steps of the batch.
A request of several answers (n choices, several prompts) runs them one after the other, each its own
generation of its prompt. Cancelling (the client went away) stops at the next token boundary; the session then
holds exactly what was generated, and is handed back only once the worker is done with it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace

from strata.errors import StrataError
from strata.generation import Piece, Session, Stats
from strata.generation.batcher import Member
from strata.server.requests import Call

_END = object()


class Refused(Exception):
    """The session refused the call's arguments before generating anything (a client error); `error` says why.
    Any other error of a run is the model's or the engine's (a server error)."""

    def __init__(self, error: StrataError):
        super().__init__(str(error))
        self.error = error


@dataclass(frozen=True)
class Event:
    """What a run hands out: a piece of answer `answer`, or (piece None) that answer's end with its stats."""

    answer: int
    piece: Piece | None = None
    stats: Stats | None = None


class Run:
    """The call's answers: answer i * n + j is choice j of prompt i (`prompts`: each one's token ids). `arrived`
    (time.perf_counter()) is when the request came: its first token's time is counted from there."""

    def __init__(self, session: Session, call: Call, prompts: Sequence[Sequence[int]], executor: Executor, *,
                 active: Callable[[], AbstractContextManager] | None = None, arrived: float | None = None):
        self.session, self.call, self.executor = session, call, executor
        self.prompts = [list(ids) for ids in prompts]
        self.active = active or nullcontext
        self.cancelled = threading.Event()
        self.answers: list[Stats] = []  # each finished answer's, in order
        self.arrived = time.perf_counter() if arrived is None else arrived
        self.first_token: float | None = None  # seconds from arrival to the first token (None: none yet)
        self.between: list[float] = []  # seconds between consecutive tokens of an answer, as generated
        self._future: asyncio.Future | None = None

    def _work(self, emit) -> None:
        engine = self.session.engine
        if not isinstance(engine, Member):
            return self._answers(emit)
        held: deque[Event] = deque()  # appended here, taken on the compute thread: deque's ends are thread-safe

        def hand_over() -> None:
            events = []
            while held:
                events.append(held.popleft())
            if events:
                emit(events)

        engine.before_compute = hand_over
        try:
            self._answers(held.append)
        finally:
            engine.before_compute = None
            hand_over()

    def _answers(self, emit) -> None:
        with self.active():
            for answer in range(self.call.answers):
                if self.cancelled.is_set():
                    return
                ids = self.prompts[answer // self.call.n]
                try:
                    stream = self.session.stream(ids, **self.call.generate_options(answer))
                except StrataError as error:
                    raise Refused(error) from None
                last = None
                try:
                    for piece in stream:
                        now = time.perf_counter()
                        if self.first_token is None:
                            self.first_token = now - self.arrived
                        elif last is not None:
                            self.between.append(now - last)
                        last = now
                        emit(Event(answer, piece))
                        if self.cancelled.is_set():
                            break
                finally:
                    stream.close()
                self.answers.append(replace(self.session.stats))
                emit(Event(answer, stats=self.answers[-1]))

    async def events(self) -> AsyncIterator[Event]:
        """The pieces as they are generated, each answer's end after its last. Raises what the generation raised
        (Refused: the session refused the arguments)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def put(events: Event | list[Event]) -> None:
            for event in events if isinstance(events, list) else [events]:
                queue.put_nowait(event)

        self._future = loop.run_in_executor(self.executor, self._work,
                                            lambda events: loop.call_soon_threadsafe(put, events))
        self._future.add_done_callback(lambda _: queue.put_nowait(_END))
        while (item := await queue.get()) is not _END:
            yield item
        self._future.result()

    async def finish(self) -> None:
        """Stop at the next token boundary and wait until the worker has let go of the session."""
        self.cancelled.set()
        if self._future is not None:
            await asyncio.wait([self._future])

    @property
    def whole(self) -> bool:
        """Whether every answer ran to its own end (none cut short by a client that went away)."""
        return len(self.answers) == self.call.answers and all(s.finish_reason != "cancelled" for s in self.answers)

    @property
    def stats(self) -> Stats:
        """The request's counts over its answers: each prompt's tokens (and those already held) once, from its
        first answer; every answer's generated and drafted tokens and times; the last answer's finish."""
        first = self.answers[::self.call.n]
        return Stats(prompt_tokens=sum(s.prompt_tokens for s in first),
                     cached_tokens=sum(s.cached_tokens for s in first),
                     generated_tokens=sum(s.generated_tokens for s in self.answers),
                     prefill_seconds=sum(s.prefill_seconds for s in first),
                     decode_seconds=sum(s.decode_seconds for s in self.answers),
                     finish_reason=self.answers[-1].finish_reason if self.answers else "",
                     steps=sum(s.steps for s in self.answers), drafted=sum(s.drafted for s in self.answers),
                     accepted=sum(s.accepted for s in self.answers))
