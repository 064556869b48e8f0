"""One request's generations, each on a session of the pool, in worker threads (an engine step blocks), with what
they produce handed to the event loop as it comes; where a session's engine is a Batcher's member, it is active
for the generation, and its pieces are handed over as the engine call for its next token starts
(Member.before_compute), so that the event loop writes them while the engine computes, not between two steps of
the batch.

A request of several answers (n choices, several prompts) runs them concurrently, each its own generation of its
prompt on its own session, so that where sessions step together (a Batcher) its answers step together. The policy:
the request's first session is taken as any request's (in turn, from the pool's queue); while answers are left to
start, it takes another session wherever one is free and no other request waits for one (`SessionPool.spare`: at
its start and whenever one of its answers ends), up to `lanes` at once; each session then runs the answers left,
in index order, one after another. One of its sessions goes back to the pool at the end of an answer where a
request waits, unless it is the request's last (that one it keeps to its end, as a request always kept its one
session): so a request never waits for a session while holding one (no deadlock, whatever n and the pool's size:
with one session it runs its answers one after another, as every request did before), and a waiting request waits
at most for the end of one answer of a request holding several. Each answer's seed is its own
(Call.generate_options), so its tokens do not depend on the session or the order it ran in.

Cancelling (the client went away) stops every answer at its next token boundary; each session then holds exactly
what it generated, and is handed back only once its worker is done with it. An answer that fails stops the others
alike, and the request fails with that error."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor
from contextlib import nullcontext
from dataclasses import dataclass, replace

from strata.errors import StrataError
from strata.generation import Piece, Session, Stats
from strata.generation.batcher import Member
from strata.server.pool import SessionPool
from strata.server.requests import Call

_LANE_ENDED = object()


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
    """The call's answers: answer i * n + j is choice j of prompt i (`prompts`: each one's token ids), run on
    `session` (taken from `pool`) and at most `lanes - 1` more sessions spared by the pool; every session goes back
    to the pool once its last answer is done. `arrived` (time.perf_counter()) is when the request came: its first
    token's time is counted from there."""

    def __init__(self, pool: SessionPool, session: Session, call: Call, prompts: Sequence[Sequence[int]],
                 executor: Executor, *, lanes: int = 1, arrived: float | None = None):
        self.pool, self.call, self.executor = pool, call, executor
        self.prompts = [list(ids) for ids in prompts]
        self.lanes = max(1, min(lanes, call.answers))
        self.cancelled = threading.Event()
        self.finished: list[Stats | None] = [None] * call.answers  # each answer's, once it ended
        self.arrived = time.perf_counter() if arrived is None else arrived
        self.first_tokens: list[float | None] = [None] * call.answers  # each answer's, from the arrival
        self.between: list[float] = []  # seconds between consecutive tokens of an answer, as generated
        self._first: Session | None = session  # until its lane starts
        self._left = deque(range(call.answers))  # the answers not started yet
        self._lanes: list[asyncio.Task] = []  # every lane started: a session running answers until it is back
        self._live = 0  # lanes that may still start an answer
        self._error: Exception | None = None

    # ------------------------------------------------------------------------------------ the event loop's side

    async def events(self) -> AsyncIterator[Event]:
        """The pieces as they are generated, each answer's after the one before and its end after its last (the
        answers' events interleave). Raises what a generation raised (Refused: the session refused the
        arguments)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def put(events: Event | list[Event]) -> None:
            for event in events if isinstance(events, list) else [events]:
                queue.put_nowait(event)

        def emit(events: Event | list[Event]) -> None:  # on a worker thread
            loop.call_soon_threadsafe(put, events)

        session, self._first = self._first, None
        if session is None:
            return
        self._lane(session, emit, queue)
        self._widen(emit, queue)
        ended = 0  # a lane starts only while another runs: when all that started have ended, none is left
        while ended < len(self._lanes):
            item = await queue.get()
            if item is not _LANE_ENDED:
                yield item
                continue
            ended += 1
            if self._error is not None:
                # taken out of the run, whose frames its traceback holds: it and they would form a cycle, which
                # kept the request's arguments and its sessions' frames until the cyclic collector ran
                error, self._error = self._error, None
                try:
                    raise error
                finally:
                    del error

    def _lane(self, session: Session, emit: Callable, queue: asyncio.Queue) -> None:
        """Run the answers left on `session`, one after another, then give it back and say so on `queue`."""
        async def run() -> None:
            loop = asyncio.get_running_loop()
            try:
                while self._left and not self.cancelled.is_set():
                    await loop.run_in_executor(self.executor, self._generate, session, self._left.popleft(), emit)
                    self._widen(emit, queue)
                    if self.pool.waiting and self._live > 1:
                        break  # a waiting request is owed this session; the request's other sessions go on
            except Exception as error:  # noqa: BLE001 - the request's, raised by events()
                self._error = self._error or error
                self.cancelled.set()
            finally:
                self._live -= 1  # before any await: another lane deciding to leave sees this one gone
                await self.pool.give_back(session)
                queue.put_nowait(_LANE_ENDED)

        self._live += 1
        self._lanes.append(asyncio.get_running_loop().create_task(run()))

    def _widen(self, emit: Callable, queue: asyncio.Queue) -> None:
        """More sessions, as the pool spares them, while answers are left to start and lanes allow."""
        while self._left and self._live < self.lanes and not self.cancelled.is_set():
            session = self.pool.spare(self.prompts[self._left[0] // self.call.n], self.call.control_vectors)
            if session is None:
                return
            self._lane(session, emit, queue)

    async def finish(self) -> None:
        """Stop every answer at the next token boundary and wait until every session is back in the pool."""
        self.cancelled.set()
        if self._first is not None:  # the run never started
            session, self._first = self._first, None
            await self.pool.give_back(session)
        if self._lanes:  # no lane starts once cancelled
            await asyncio.wait(self._lanes)

    # ------------------------------------------------------------------------------------------ a worker's side

    def _generate(self, session: Session, answer: int, emit: Callable) -> None:
        engine = session.engine
        if not isinstance(engine, Member):
            return self._answer(session, answer, emit)
        held: deque[Event] = deque()  # appended here, taken where an engine call starts: deque's ends are thread-safe
        # Any engine call's start hands them over (Member.before_compute), on the compute thread or a lone step's,
        # and this thread does once more at the end: one at a time, so that they reach the loop in order.
        handing = threading.Lock()

        def hand_over() -> None:
            with handing:
                events = []
                while held:
                    events.append(held.popleft())
                if events:
                    emit(events)

        engine.before_compute = hand_over
        try:
            with engine.active():
                self._answer(session, answer, held.append)
        finally:
            engine.before_compute = None
            hand_over()

    def _answer(self, session: Session, answer: int, emit: Callable) -> None:
        if self.cancelled.is_set():
            return
        ids = self.prompts[answer // self.call.n]
        self.pool.steer(session, self.call.control_vectors)
        try:
            stream = session.stream(ids, **self.call.generate_options(answer))
        except StrataError as error:
            raise Refused(error) from None
        last = None
        try:
            for piece in stream:
                now = time.perf_counter()
                if last is None:
                    self.first_tokens[answer] = now - self.arrived
                else:
                    self.between.append(now - last)
                last = now
                emit(Event(answer, piece))
                if self.cancelled.is_set():
                    break
        finally:
            stream.close()
        self.finished[answer] = replace(session.stats)
        emit(Event(answer, stats=self.finished[answer]))

    # ------------------------------------------------------------------------------------------ the counts

    @property
    def answers(self) -> list[Stats]:
        """The stats of the answers that ran, in index order (they start in that order: the first ones)."""
        return [stats for stats in self.finished if stats is not None]

    @property
    def first_token(self) -> float | None:
        """Seconds from the arrival to the request's first token (None: none yet)."""
        return min((t for t in self.first_tokens if t is not None), default=None)

    @property
    def whole(self) -> bool:
        """Whether every answer ran to its own end (none cut short by a client that went away)."""
        return len(self.answers) == self.call.answers and all(s.finish_reason != "cancelled" for s in self.answers)

    @property
    def stats(self) -> Stats:
        """The request's counts over its answers: each prompt's tokens (and those already held) once, from the
        first of its answers that ran; every answer's generated and drafted tokens and times; the last answer's
        finish."""
        n = self.call.n
        firsts = [next((s for s in self.finished[i:i + n] if s is not None), None)
                  for i in range(0, len(self.finished), n)]
        first = [s for s in firsts if s is not None]
        answers = self.answers
        return Stats(prompt_tokens=sum(s.prompt_tokens for s in first),
                     cached_tokens=sum(s.cached_tokens for s in first),
                     generated_tokens=sum(s.generated_tokens for s in answers),
                     prefill_seconds=sum(s.prefill_seconds for s in first),
                     decode_seconds=sum(s.decode_seconds for s in answers),
                     finish_reason=answers[-1].finish_reason if answers else "",
                     steps=sum(s.steps for s in answers), drafted=sum(s.drafted for s in answers),
                     accepted=sum(s.accepted for s in answers))
