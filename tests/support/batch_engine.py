"""Engines with the batched step a Batcher gathers decode steps into (strata.generation.batcher): step_batch
delegates to each engine's own feed, so its answers are the engine's, and records what it was given, and every
engine call records the thread it ran on. CostedTable's calls cost stated seconds on a ScriptedClock, which a
Batcher can be timed by instead of the machine's."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

from strata.errors import InvalidArgument
from strata.generation.batch_policy import chunks
from strata.reference.engine import ReferenceEngine
from strata.sampling import log_probabilities
from support.table_engine import TableEngine

# what a caller of the Engine protocol reaches on an engine: each use is recorded with its thread
ENGINE_API = frozenset({"feed", "prefill", "verify", "truncate", "logprobs", "snapshot", "restore", "reset", "score",
                        "position", "context", "snapshots", "verify_rows", "batch_key", "max_batch", "close"})


@dataclass
class BatchLog:
    """What a set of batching engines saw: each step_batch's engines' keys (its size is their number), the
    threads every engine call ran on (and those of the batched steps), the most engine calls that ran at once, and
    (table engines) every call in order: (engine, call, ids)."""

    batches: list[list[object]] = field(default_factory=list)
    rows: list[list[int]] = field(default_factory=list)  # each step_rows' parts' rows (RowsTable)
    threads: set[int] = field(default_factory=set)
    batch_threads: set[int] = field(default_factory=set)
    running: dict[int, int] = field(default_factory=dict)  # thread: depth of its engine calls (one may call another)
    most_running: int = 0  # the most threads in engine calls at once
    calls: list[tuple[object, str, int]] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def calls_one_at_a_time_on(self, thread: int | None) -> bool:
        """Whether the engines' calls never overlapped (no two threads in them at once) and every batched step ran on
        `thread` (a batcher's: a lone decode step may run on its member's own thread, where nothing could be gathered
        with it)."""
        return self.most_running <= 1 and self.batch_threads <= {thread}

    @contextmanager
    def call(self):
        """An engine call, counted while it runs."""
        thread = threading.get_ident()
        with self.lock:
            self.threads.add(thread)
            self.running[thread] = self.running.get(thread, 0) + 1
            self.most_running = max(self.most_running, len(self.running))
        try:
            yield
        finally:
            with self.lock:
                self.running[thread] -= 1
                if not self.running[thread]:
                    del self.running[thread]

    @property
    def sizes(self) -> list[int]:
        return [len(keys) for keys in self.batches]


class Batching:
    """Mixin: the engine class's batched step, keyed by `batch_key`, taking at most `max_batch` engines."""

    def __init__(self, *args, log: BatchLog, batch_key: object = "model", max_batch: int | None = None, **kwargs):
        object.__setattr__(self, "log", log)
        self.batch_key = batch_key
        if max_batch is not None:
            self.max_batch = max_batch
        super().__init__(*args, **kwargs)

    @staticmethod
    def step_batch(engines, ids, params, us, seens) -> list[int]:
        log = engines[0].log
        with log.lock:
            log.batch_threads.add(threading.get_ident())
            log.batches.append([e.batch_key for e in engines])
        if len({e.batch_key for e in engines}) != 1 or any(e.batch_key is None for e in engines):
            raise AssertionError(f"engines of batch keys {[e.batch_key for e in engines]} stepped together")
        limit = getattr(engines[0], "max_batch", None)
        if limit is not None and len(engines) > limit:
            raise AssertionError(f"{len(engines)} engines stepped together, over max_batch {limit}")
        return [e.feed([i], p, u, s) for e, i, p, u, s in zip(engines, ids, params, us, seens)]

    def __getattribute__(self, name: str):
        value = super().__getattribute__(name)
        if name not in ENGINE_API:
            return value
        log = object.__getattribute__(self, "log")
        if not callable(value):
            with log.lock:
                log.threads.add(threading.get_ident())
            return value

        def counted(*args, **kwargs):
            with log.call():
                return value(*args, **kwargs)

        return counted


class BatchingTable(Batching, TableEngine):
    """support.table_engine.TableEngine with the batched step and prefill (so a Batcher splits its prompts)."""

    def prefill(self, ids, seen) -> None:
        self._append("prefill", ids, seen)
        self._logits = self.table[self.sequence[-1]]

    def _append(self, call: str, ids, seen) -> None:
        super()._append(call, ids, seen)
        self.log.calls.append((self, call, len(ids)))


class RowsTable(BatchingTable):
    """A BatchingTable whose class also steps several engines' rows at once (step_rows: verifications beside
    steps), delegating each part to the engine's own verify or feed; log.rows has each step_rows' parts' rows."""

    @staticmethod
    def step_rows(engines, ids, verify, params, us, seens) -> list:
        log = engines[0].log
        with log.lock:
            log.batch_threads.add(threading.get_ident())
            log.rows.append([len(part) for part in ids])
        limit = getattr(engines[0], "max_batch", None)
        if limit is not None and sum(len(part) for part in ids) > limit:
            raise AssertionError(f"{sum(len(part) for part in ids)} rows stepped together, over max_batch {limit}")
        return [e.verify(part, seen) if v else e.feed(part, p, u, seen)
                for e, part, v, p, u, seen in zip(engines, ids, verify, params, us, seens)]


class BatchingReference(Batching, ReferenceEngine):
    """The reference engine with the batched step."""


class FailingAt(Batching, TableEngine):
    """A TableEngine whose feed raises ValueError once the sequence holds `fail_at` tokens."""

    def __init__(self, *args, fail_at: int, **kwargs):
        self.fail_at = fail_at
        super().__init__(*args, **kwargs)

    def feed(self, ids, params, u, seen) -> int:
        if self.position + len(ids) >= self.fail_at:
            raise ValueError(f"engine failed at {self.fail_at}")
        return super().feed(ids, params, u, seen)


class AlwaysBatch:
    """A batch policy that batches every group as one (split only by the limit) and always gathers: what tests of
    the gathering use, whose engines' step_batch costs as much as its rows alone (the measured policy would rightly
    step them alone)."""

    def plan(self, key, rows, limit=None) -> list[int]:
        return chunks(rows, limit or rows)

    def gathers(self, key) -> bool:
        return True

    def record(self, key, rows, seconds) -> None:
        pass


class ScriptedClock:
    """Seconds that pass only when an engine call says they do (`advance`), for a Batcher's `clock`: the batcher is
    then timed by the stated costs alone, and its grace never runs out while no engine computes (a batch waits for
    every member it gathers, however slowly the machine runs the threads)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.paused = False

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if not self.paused:
            self.now += seconds


@dataclass(frozen=True)
class Costs:
    """What an engine call costs, in seconds: a lone decode step, a batched step of n rows, a prompt piece of n
    ids (a feed or prefill of more than one)."""

    lone: float
    batch: object  # Callable[[int], float]
    prompt: object  # Callable[[int], float]


class CostedTable(BatchingTable):
    """A BatchingTable whose calls advance a ScriptedClock by stated Costs, with the token mask of structured output
    (token_masks, logprobs under a mask)."""

    token_masks = True

    def __init__(self, *args, clock: ScriptedClock, costs: Costs, **kwargs):
        object.__setattr__(self, "clock", clock)
        object.__setattr__(self, "costs", costs)
        super().__init__(*args, **kwargs)

    def feed(self, ids, params, u, seen) -> int:
        self.clock.advance(self.costs.lone if len(ids) == 1 else self.costs.prompt(len(ids)))
        return super().feed(ids, params, u, seen)

    def prefill(self, ids, seen) -> None:
        self.clock.advance(self.costs.prompt(len(ids)))
        super().prefill(ids, seen)

    def logprobs(self, token, n, token_mask=None):
        if self._logits is None:
            raise InvalidArgument("logprobs are undefined after a truncate")
        return log_probabilities(self._logits, token, n, token_mask)

    @staticmethod
    def step_batch(engines, ids, params, us, seens) -> list[int]:
        engines[0].log.calls.append((None, "step_batch", len(engines)))  # the rows' feeds follow it
        clock = engines[0].clock
        clock.advance(engines[0].costs.batch(len(engines)))
        clock.paused = True  # the rows' own feeds cost nothing more
        try:
            return Batching.step_batch(engines, ids, params, us, seens)
        finally:
            clock.paused = False
