"""Continuous batching: several sessions' decode steps gathered into one engine call, their prompts interleaved.

A Batcher owns one compute thread; every engine call of every member (`Batcher.member(engine)`, an Engine that a
Session drives as it would the engine itself) runs there, and the caller blocks for its result, but for a decode
step with nothing to be gathered with (_runs_inline), which its caller's thread runs while the compute thread waits:
engine calls never overlap. A decode step is a `feed` of exactly one id: the members' steps are gathered and run
together, as one `step_batch` for engines that share a `batch_key` (below), one by one for the others. A prompt (a
feed or prefill of more ids) is split into its engine's chunks, and the thread alternates: one prompt chunk, then
one decode batch of every step waiting (more chunks first while the oldest step has waited less than
`decode_stall_seconds`, 0 by default). So, without a stall, a decoding member waits at most one chunk per token, and
a new prompt advances a chunk per token step. The other calls (snapshot, logprobs, a verify the engine cannot batch,
...) run alone, in the order they came, before either.

The batched step an engine class may offer (same model: the same non-None `batch_key`; None: never batched):

    batch_key: object | None
    max_batch: int                      # optional: the most rows one step takes (default: no limit)
    @staticmethod
    def step_batch(engines, ids, params, us, seens) -> list[int]:
        # what engines[i].feed([ids[i]], params[i], us[i], seens[i]) would return, for each i, in one step
    @staticmethod
    def step_rows(engines, ids, verify, params, us, seens) -> list:   # optional
        # one step of several engines' rows: where verify[i], what engines[i].verify(ids[i], seens[i]) returns,
        # else ids[i] is one id and the token engines[i].feed(ids[i], params[i], us[i], seens[i]) returns

With step_rows, a member's verification (a drafting session's k + 1 rows) is gathered with the decode steps of its
batch key and run in one step of their rows (as many rows as max_batch at most); without it, it runs alone.

A step_batch that raises fails each of its rows' calls with that error (one call stepped them all). The steps of a
batch key waiting together run as the policy plans them (strata.generation.batch_policy, from the seconds each
size took here): as batches of the sizes that cost least, or one at a time where no batch beats its steps alone.

A decode batch is gathered: it waits for the active members of its batch key that have no call pending (busy in
Python between their tokens), at most `grace_seconds` counted from when its first step came or the thread last
finished a job, whichever is later (a step that came while the thread was busy does not run alone for having waited
then: it is gathered with the members that job stepped). Members of other keys, members whose engine never batches,
and keys whose batches lose (the policy's `gathers`) are not waited for.
"""

from __future__ import annotations

import inspect
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from strata.errors import InvalidArgument, StrataError
from strata.generation.batch_policy import BatchPolicy
from strata.sampling import SamplingParams

# How long a gathered decode batch waits for the active members that have no call pending (busy in Python:
# detokenizing, stop strings, a client write) after its first step arrived or the thread's last job ended: a few of
# those per token, against the milliseconds a decode step of a large MoE takes, so one slow member does not stall
# the others long.
GRACE_SECONDS = 0.002
# How long a waiting decode step lets prompt chunks run before its batch (one chunk more at most: the one running
# when it is reached). 0, the default: a decode batch after every chunk. A stall runs a burst of new requests'
# prompts close together, each one's first token sooner, while the members decoding wait that long at most; with
# the scripted engine at the box's costs (docs/server.md) 20 ms took eight clients' time to first token p90 from 65
# to 51 ms but its p50 from 19 to 32 ms (the clients, their prompts run together, then decode and come back
# together), so the box decides it.
DECODE_STALL_SECONDS = 0.0
# Prompt ids per chunk for an engine without a prompt path (it steps each id, so any split feeds the same): a long
# prompt then holds the decode batch back by this many steps at most.
STEPPED_PROMPT_CHUNK = 8
# What an engine reads once, when it becomes a member: fixed for its life, and asked for on every token.
FIXED_ATTRIBUTES = ("context", "snapshots", "verify_rows", "prompt_chunk", "prompt_min_tokens", "mode", "batch_key",
                    "max_batch", "token_masks")

__all__ = ["DECODE_STALL_SECONDS", "GRACE_SECONDS", "Batcher", "Member", "prompt_pieces"]


def prompt_pieces(n: int, chunk: int, whole_below: int = 1) -> list[int]:
    """The lengths a prompt of `n` ids is fed in: `chunk` each, where the last, shorter, piece joins the one before
    it if under `whole_below` ids (an engine steps so few ids one by one, where the whole feed ran them through its
    prompt path, chunked from its first id as here); fewer than `whole_below` ids stay whole, and no piece is
    shorter."""
    if chunk < 1:
        raise InvalidArgument(f"a prompt chunk must be >= 1 id, got {chunk}")
    chunk = max(chunk, whole_below)
    if n <= chunk or n < whole_below:
        return [n]
    sizes = [chunk] * (n // chunk)
    rest = n % chunk
    if rest and rest < whole_below:
        sizes[-1] += rest
    elif rest:
        sizes.append(rest)
    return sizes


@dataclass
class _Call:
    """One member's request to the compute thread: a decode step (`step`: its id, params, u, seen), or `work`, run
    one piece per turn (a prompt's chunks; any other call is one piece); done once its last piece returns."""

    member: Member
    prompt: bool = False
    work: deque[Callable[[], Any]] = field(default_factory=deque)
    step: tuple[int, SamplingParams, float, Sequence[int]] | None = None
    verify: tuple[list[int], Sequence[int]] | None = None  # a verification gathered as a step: its ids and seen

    @property
    def rows(self) -> int:
        """The rows of a step's engine call this call takes."""
        return len(self.verify[0]) if self.verify is not None else 1
    result: Any = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Batcher:
    """The compute thread of a set of members (`member(engine)`), pinned to `cpus` (None: left as it is), stepping
    at most `max_batch` of them together (None: as many as the engine takes) as `policy` plans (default: a
    BatchPolicy of its own), a decode batch waiting at most `grace_seconds` for its active members' steps, and
    prompt chunks running before it while its oldest step has waited less than `decode_stall_seconds`. `clock`
    (seconds) times the grace, the stall, the policy's measurements and the counters. `close()` lets it finish what
    is queued and stop."""

    def __init__(self, cpus: set[int] | None = None, max_batch: int | None = None,
                 grace_seconds: float = GRACE_SECONDS, policy: BatchPolicy | None = None,
                 clock: Callable[[], float] = time.perf_counter, decode_stall_seconds: float = DECODE_STALL_SECONDS):
        if max_batch is not None and max_batch < 1:
            raise InvalidArgument(f"max_batch must be >= 1 (or None: no limit), got {max_batch}")
        for name, value in (("grace_seconds", grace_seconds), ("decode_stall_seconds", decode_stall_seconds)):
            if not value >= 0:
                raise InvalidArgument(f"{name} must be >= 0, got {value}")
        self.max_batch, self.grace_seconds, self.clock = max_batch, grace_seconds, clock
        self.decode_stall_seconds = decode_stall_seconds
        # how a group of waiting steps runs, from what each size cost here
        self.policy = policy if policy is not None else BatchPolicy()
        self._cond = threading.Condition()
        self._steps: list[_Call] = []      # decode steps waiting, at most one per member
        self._chunks: deque[_Call] = deque()  # prompts, each advanced a chunk per turn, round robin
        self._calls: deque[_Call] = deque()   # everything else, FIFO
        self._members: list[Member] = []
        self._first_step = 0.0  # when the oldest waiting decode step came
        self._turn_start = 0.0  # when the thread last finished a job
        self._closing = False
        self._job = False  # the compute thread is in an engine call
        self._inline = False  # a caller's thread is in an engine call (_runs_inline)
        self._counts = {"decode_batches": 0, "decode_rows": 0, "prompt_chunks": 0, "calls": 0, "inline_steps": 0}
        self._sizes: Counter[int] = Counter()  # decode engine calls by their rows
        self._seconds = {"busy": 0.0, "gathering": 0.0}
        self._thread = threading.Thread(target=self._run, args=(cpus,), name="strata-batcher", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------------------ public

    def member(self, engine: Any) -> Member:
        """`engine` as a member: an Engine whose every call runs on this batcher's thread."""
        member = Member(self, engine)
        with self._cond:
            self._members.append(member)
        return member

    def stats(self) -> dict[str, Any]:
        """Counters since start: decode_batches (engine calls that stepped decode rows: a step_batch, or a lone
        feed; inline_steps of them ran on their callers' threads), decode_rows (rows they stepped; rows / batches
        is the mean batch), batch_sizes ({rows: engine calls}), prompt_chunks, calls (the rest); busy_seconds (in
        engine calls), gathering_seconds (waiting, a decode step in, for the members a batch gathers)."""
        with self._cond:
            return {**self._counts, "batch_sizes": dict(self._sizes), "busy_seconds": self._seconds["busy"],
                    "gathering_seconds": self._seconds["gathering"]}

    @property
    def thread_id(self) -> int | None:
        """The compute thread's id (threading.get_ident() there)."""
        return self._thread.ident

    def close(self) -> None:
        """Run what is queued, then stop the thread; later calls raise StrataError."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if threading.get_ident() != self._thread.ident:
            self._thread.join()

    def __enter__(self) -> Batcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ the callers' side

    def _submit(self, call: _Call) -> Any:
        if threading.get_ident() == self._thread.ident:
            raise StrataError("a member's engine was called from the batcher's own thread (it would wait for itself)")
        with self._cond:
            if self._closing:
                raise StrataError("the batcher is closed: its members' engines take no more calls")
            call.member._joined = True
            inline = self._runs_inline(call)
            if inline:
                # the compute thread starts no job until it is done; it has none to start, so it is not woken
                self._inline = True
            else:
                if call.step is not None or call.verify is not None:
                    if not self._steps:
                        self._first_step = self.clock()
                    self._steps.append(call)
                elif call.prompt:
                    self._chunks.append(call)
                else:
                    self._calls.append(call)
                self._cond.notify_all()
        if inline:
            self._step_inline(call)
        call.done.wait()
        if call.error is not None:
            raise call.error
        return call.result

    def _runs_inline(self, call: _Call) -> bool:
        """Whether `call` (called holding the lock) runs on its caller's thread: a decode step of the only active
        member, with nothing queued and no engine call running, has nothing to be gathered with, and the two
        handoffs to the compute thread and back cost one client alone 8-12 % of its tokens (docs/server.md)."""
        if call.step is None or self._job or self._inline or self._steps or self._chunks or self._calls:
            return False
        return not any(m._active and m._joined for m in self._members if m is not call.member)

    def _step_inline(self, call: _Call) -> None:
        """The decode step `call` on this thread, as the compute thread would run it alone; the compute thread
        waits for it (_inline) before its next job."""
        start = self.clock()
        try:
            self._step_all([call])
        finally:
            with self._cond:
                self._inline = False
                self._counts["inline_steps"] += 1
                self._turn_ended(start)
                if self._steps or self._chunks or self._calls or self._closing:  # what came meanwhile, now its turn
                    self._cond.notify_all()

    def _turn_ended(self, start: float) -> None:
        """An engine call that began at `start` has ended (called holding the lock): the turn's end, the busy time."""
        self._turn_start = self.clock()
        self._seconds["busy"] += self._turn_start - start

    def _set_active(self, member: Member, active: bool) -> None:
        """A member begins (waited for from its next call) or ends (waited for no more)."""
        with self._cond:
            member._active, member._joined = active, False
            self._cond.notify_all()

    # ------------------------------------------------------------------------------------ the compute thread

    def _run(self, cpus: set[int] | None) -> None:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
        last_was_chunk = False
        while True:
            with self._cond:
                while self._inline or (job := self._next(last_was_chunk)) is None:
                    if self._closing and not (self._steps or self._chunks or self._calls or self._inline):
                        return
                    self._cond.wait(None if self._inline else self._gather_left())
                self._job = True
            kind, calls = job
            start = self.clock()
            if kind == "steps":
                self._step_all(calls)
            else:
                self._advance(calls[0], kind)
            if kind != "call":  # the calls between them do not change whose turn it is
                last_was_chunk = kind == "chunk"
            with self._cond:
                self._job = False
                self._turn_ended(start)

    def _next(self, last_was_chunk: bool) -> tuple[str, list[_Call]] | None:
        """The next job under the policy (called holding the lock), taken off its queue; None: wait. After a decode
        batch comes a prompt chunk where one waits; after a chunk, more chunks while the oldest decode step waiting
        has waited less than decode_stall_seconds (or none waits, and no active member has a step coming), then the
        decode batch, gathered."""
        if self._calls:
            return "call", [self._calls.popleft()]
        ready = self._gathered() or self._gather_left() == 0.0 or self._closing
        stalled = bool(self._steps) and self.clock() - self._first_step >= self.decode_stall_seconds
        if self._steps and ready and (not self._chunks or (last_was_chunk and stalled)):
            self._seconds["gathering"] += max(0.0, self.clock() - max(self._first_step, self._turn_start))
            steps, self._steps = self._steps, []
            return "steps", steps
        if self._chunks and (not last_was_chunk or (self._steps and not stalled) or (not self._steps and ready)):
            return "chunk", [self._chunks.popleft()]
        return None

    def _gathered(self) -> bool:
        """Whether every member a decode batch now waits for has a call waiting: the active members that have
        called since they began, of the batch keys of the steps waiting that the policy finds worth gathering (with
        no step waiting, of every key: a prompt's next chunk waits for the steps coming)."""
        waiting = {id(c.member) for c in (*self._steps, *self._chunks, *self._calls)}
        if self._steps:
            groups = {c.member._group for c in self._steps}
            groups = {g for g in groups if g is not None and self.policy.gathers(g)}
            awaited = [m for m in self._members if m._group in groups]
        else:
            awaited = self._members
        return all(id(m) in waiting for m in awaited if m._active and m._joined)

    def _gather_left(self) -> float | None:
        """Seconds left to wait for the active members' steps (None: nothing waits): from the first step waiting or
        the end of the last job, whichever came later."""
        if not (self._steps or self._chunks):
            return None
        since = max(self._first_step, self._turn_start) if self._steps else self._turn_start
        return max(0.0, since + self.grace_seconds - self.clock())

    def _before_compute(self, calls: list[_Call]) -> None:
        """Every member's before_compute, right before an engine call, whichever members it serves: what a member
        has to hand on goes out as soon as the engine next computes, not only at its own next call (a prompt's first
        token while other prompts' chunks run before its first decode step). What a member's own hook raises fails
        the call; what another's raises is kept for that member's next call, which it fails."""
        serving = {id(call.member) for call in calls}
        for member in list(self._members):
            own = id(member) in serving
            if own and member._hook_error is not None:
                error, member._hook_error = member._hook_error, None
                raise error
            hook = member.before_compute
            if hook is None:
                continue
            if own:
                hook()
                continue
            try:
                hook()
            except BaseException as error:  # noqa: BLE001 - its own next call raises it
                member._hook_error = error

    def _advance(self, call: _Call, kind: str) -> None:
        """Run the call's next piece; finish it after its last, else queue it behind the other prompts."""
        try:
            self._before_compute([call])
            call.result = call.work.popleft()()
        except BaseException as error:  # noqa: BLE001 - the caller's to handle, with its type
            call.error = error
            call.work.clear()
        with self._cond:
            self._counts["prompt_chunks" if kind == "chunk" else "calls"] += 1
            if call.work:
                self._chunks.append(call)
        if not call.work:
            call.done.set()

    def _step_all(self, calls: list[_Call]) -> None:
        """One decode round: the steps of engines that share a batch key as the policy plans them (step_batch calls
        of at most max_batch rows, the batcher's and the engine's, or lone feeds), every other step alone."""
        groups: dict[Hashable, list[_Call]] = {}
        for call in calls:
            if call.member._group is None:
                self._step_rows([call])
            else:
                groups.setdefault(call.member._group, []).append(call)
        for key, group in groups.items():
            limits = [n for n in (self.max_batch, group[0].member._fixed.get("max_batch")) if n]
            limit = min(limits) if limits else None
            if any(c.verify is not None for c in group):
                for rows in _rows_of_at_most(group, limit):  # the policy knows one-row steps only
                    self._step_rows(rows)
                continue
            start = 0
            for size in self.policy.plan(key, len(group), limit) if len(group) > 1 else [1]:
                self._step_timed(key, group[start:start + size])
                start += size

    def _step_timed(self, key: Hashable, calls: list[_Call]) -> None:
        """_step_rows, its seconds told to the policy where it succeeded."""
        start = self.clock()
        if self._step_rows(calls):
            self.policy.record(key, len(calls), self.clock() - start)

    def _step_rows(self, calls: list[_Call]) -> bool:
        """The calls' steps (and verifications) in one engine call; whether it succeeded (else every call has its
        error)."""
        ok = False
        try:
            self._before_compute(calls)
            if len(calls) == 1 and calls[0].verify is not None:
                ids, seen = calls[0].verify
                results = [calls[0].member.engine.verify(ids, seen)]
            elif len(calls) == 1:
                token, params, u, seen = calls[0].step
                results = [calls[0].member.engine.feed([token], params, u, seen)]
            elif any(c.verify is not None for c in calls):
                results = _step_rows_of(calls)
            else:
                engines = [c.member.engine for c in calls]
                ids, params, us, seens = zip(*(c.step for c in calls))
                results = list(type(engines[0]).step_batch(engines, list(ids), list(params), list(us), list(seens)))
                if len(results) != len(calls):
                    raise StrataError(f"step_batch returned {len(results)} tokens for {len(calls)} engines")
            for call, token in zip(calls, results):
                call.result = token
            ok = True
        except BaseException as error:  # noqa: BLE001 - every row's caller gets it
            for call in calls:
                call.error = error
        rows = sum(c.rows for c in calls)
        with self._cond:
            self._counts["decode_batches"] += 1
            self._counts["decode_rows"] += rows
            self._sizes[rows] += 1
        for call in calls:
            call.done.set()
        return ok


def _rows_of_at_most(calls: list[_Call], limit: int | None) -> Iterator[list[_Call]]:
    """The calls in order, as runs of at most `limit` rows (None: one run); a call of more rows runs alone."""
    run: list[_Call] = []
    rows = 0
    for call in calls:
        if run and limit is not None and rows + call.rows > limit:
            yield run
            run, rows = [], 0
        run.append(call)
        rows += call.rows
    if run:
        yield run


def _step_rows_of(calls: list[_Call]) -> list[Any]:
    """The calls' steps and verifications as one step_rows of their engines' class: a verification's rows' logits,
    a step's token."""
    engines = [c.member.engine for c in calls]
    ids, verify, params, us, seens = [], [], [], [], []
    for call in calls:
        if call.verify is not None:
            ids.append(call.verify[0])
            verify.append(True)
            params.append(SamplingParams())
            us.append(0.0)
            seens.append(call.verify[1])
        else:
            token, p, u, seen = call.step
            ids.append([token])
            verify.append(False)
            params.append(p)
            us.append(u)
            seens.append(seen)
    results = list(type(engines[0]).step_rows(engines, ids, verify, params, us, seens))
    if len(results) != len(calls):
        raise StrataError(f"step_rows returned {len(results)} parts for {len(calls)} engines")
    return results


class Member:
    """An engine driven through a Batcher: the Engine protocol, with the engine's own optional abilities (what it
    lacks, the member lacks), each call run on the batcher's thread. `active()` (or begin()/end()) marks a stretch
    of steady decoding, such as one generation: the batcher waits for an active member's next step (briefly)
    before stepping the others without it.

    `before_compute` (None, or a callable its caller sets) runs on the thread that makes each engine call right
    before it, whichever members the call serves (its decode step, batched or alone, a prompt chunk, any other
    call, and the other members' calls alike): what the caller hands on there runs beside the engine's computing
    rather than between its steps (the server hands a stream's events to its event loop there, so that writing them
    overlaps the step that makes the next, and a prompt's first token goes out while other prompts' chunks run). It
    must be quick; what it raises fails this member's call, or its next one where another member's call ran it."""

    def __init__(self, batcher: Batcher, engine: Any):
        self.batcher, self.engine = batcher, engine
        self.before_compute: Callable[[], None] | None = None
        self._hook_error: BaseException | None = None  # what before_compute raised before another member's call
        self._active = False
        self._joined = False  # called since begin(): a member is waited for from its first call
        self._fixed = self._call(self._read_fixed)
        # the batch key its steps are gathered under (its engine's class and batch_key); None: it steps alone
        key = self._fixed.get("batch_key")
        self._group = None if key is None or not hasattr(type(engine), "step_batch") else (type(engine), key)

    def _read_fixed(self) -> dict[str, Any]:
        return {name: getattr(self.engine, name) for name in FIXED_ATTRIBUTES if hasattr(self.engine, name)}

    # ------------------------------------------------------------------------------------------ activity

    def begin(self) -> None:
        self.batcher._set_active(self, True)

    def end(self) -> None:
        self.batcher._set_active(self, False)

    @contextmanager
    def active(self) -> Iterator[Member]:
        self.begin()
        try:
            yield self
        finally:
            self.end()

    # ------------------------------------------------------------------------------------------ the engine

    def feed(self, ids: Sequence[int], params: SamplingParams, u: float, seen: Sequence[int]) -> int:
        """A decode step (one id) gathered with the other members', or a prompt fed chunk by chunk."""
        if len(ids) == 1:
            return self.batcher._submit(_Call(self, step=(ids[0], params, u, seen)))
        return self._prompt(ids, seen, lambda piece, history: self.engine.feed(piece, params, u, history))

    def _verify(self, ids: Sequence[int], seen: Sequence[int]) -> Any:
        """A verification gathered with the other members' steps into one step of their rows (step_rows)."""
        return self.batcher._submit(_Call(self, verify=([int(t) for t in ids], seen)))

    def _prefill(self, ids: Sequence[int], seen: Sequence[int]) -> None:
        self._prompt(ids, seen, lambda piece, history: self.engine.prefill(piece, history))

    def _prompt(self, ids: Sequence[int], seen: Sequence[int], last: Callable[[Sequence[int], Sequence[int]], Any]):
        """Feed `ids` in the engine's chunks, all but the last as prefill (which the engine must have to be split):
        the same as one call of `last` on them all."""
        chunk = self._fixed.get("prompt_chunk") or 0
        pieces = [len(ids)]
        if hasattr(type(self.engine), "prefill"):
            pieces = prompt_pieces(len(ids), chunk or STEPPED_PROMPT_CHUNK,
                                   self._fixed.get("prompt_min_tokens", 1) if chunk else 1)
        base, start, work = len(seen) - len(ids), 0, deque()
        for i, size in enumerate(pieces):
            piece, history = ids[start:start + size], seen[:base + start + size]
            run = last if i == len(pieces) - 1 else lambda piece, history: self.engine.prefill(piece, history)
            work.append(lambda run=run, piece=piece, history=history: run(piece, history))
            start += size
        return self.batcher._submit(_Call(self, prompt=True, work=work))

    def _call(self, function: Callable[[], Any]) -> Any:
        return self.batcher._submit(_Call(self, work=deque([function])))

    def __getattr__(self, name: str) -> Any:
        """The engine's attribute `name`: fixed ones as read when it joined; methods as callables that run on the
        batcher's thread; anything else read there."""
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._fixed:
            return self._fixed[name]
        if name in FIXED_ATTRIBUTES:
            raise AttributeError(f"{type(self.engine).__name__} has no attribute {name!r}")
        if name == "prefill" and hasattr(type(self.engine), "prefill"):
            return self._prefill
        if name == "verify" and self._group is not None and hasattr(type(self.engine), "step_rows"):
            return self._verify
        try:
            found = inspect.getattr_static(self.engine, name)
        except AttributeError:
            found = None
        if isinstance(found, (staticmethod, classmethod)) or inspect.isfunction(found):
            return lambda *args, **kwargs: self._call(lambda: getattr(self.engine, name)(*args, **kwargs))
        value = self._call(lambda: getattr(self.engine, name))  # AttributeError there reaches the caller
        if callable(value) and not isinstance(value, type):
            return lambda *args, **kwargs: self._call(lambda: value(*args, **kwargs))
        return value
