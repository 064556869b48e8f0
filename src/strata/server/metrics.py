"""The server's counters in Prometheus' text format: requests by endpoint and status, tokens in and out, drafted
and accepted tokens, the queue, the sessions, decode speed; histograms (Prometheus' conventions: cumulative
`_bucket{le="..."}` samples ending at `le="+Inf"`, `_sum`, `_count`, seconds as the unit of time) of the time to
first token, the time between tokens and the queue's depth as each request arrived; and where sessions step
together, their batches (a histogram of their rows) and the compute thread's busy and gathering seconds."""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from strata.generation import Stats

# Buckets' upper bounds. Time to first token: from a request's arrival (queue and prompt included) to its first
# token, milliseconds to minutes. Between tokens: a decode step alone is ~2-10 ms on the GPU, a batch of 16 ~17 ms,
# a step behind a prompt chunk tens of ms. Queue depth: requests waiting. Batch rows: sessions stepped in one call.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)
DEPTH_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128)
ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class Histogram:
    """Observations counted into buckets of upper bounds `bounds` (ascending; +Inf is implied), with their sum."""

    def __init__(self, bounds: Sequence[float]):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # per bucket, not cumulative; the last is above every bound
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def lines(self, name: str, what: str) -> list[str]:
        return _histogram_lines(name, what, self.bounds, self.counts, self.sum)


def counted(bounds: Sequence[float], values: Mapping[float, int]) -> tuple[list[int], float]:
    """Per-bucket counts and the sum of `values` ({value: how many times}) in buckets of `bounds`."""
    counts = [0] * (len(bounds) + 1)
    for value, times in values.items():
        counts[bisect.bisect_left(bounds, value)] += times
    return counts, float(sum(value * times for value, times in values.items()))


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.prompt_tokens = self.cached_tokens = self.generated_tokens = 0
        self.drafted_tokens = self.accepted_tokens = 0
        self.decode_tokens_per_second = 0.0
        self.time_to_first_token = Histogram(TTFT_BUCKETS)
        self.inter_token = Histogram(ITL_BUCKETS)
        self.queue_depth = Histogram(DEPTH_BUCKETS)

    def answered(self, endpoint: str, status: int, stats: Stats | None = None) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1
            if stats is not None:
                self.prompt_tokens += stats.prompt_tokens
                self.cached_tokens += stats.cached_tokens
                self.generated_tokens += stats.generated_tokens
                self.drafted_tokens += stats.drafted
                self.accepted_tokens += stats.accepted
                if stats.generated_tokens > 1:
                    self.decode_tokens_per_second = stats.decode_tokens_per_second

    def arrived(self, waiting: int) -> None:
        """A request that found `waiting` requests waiting for a session, itself included where it waits."""
        with self._lock:
            self.queue_depth.observe(waiting)

    def timed(self, first_token: float | None, between: Iterable[float]) -> None:
        """A request's seconds from its arrival to its first token (None: it had none) and between its tokens."""
        with self._lock:
            if first_token is not None:
                self.time_to_first_token.observe(first_token)
            for seconds in between:
                self.inter_token.observe(seconds)

    def text(self, pool, batcher=None) -> str:
        """The counters; `batcher` (a strata.generation.batcher.Batcher, where sessions step together) adds its."""
        with self._lock:
            lines = ["# HELP strata_requests_total Requests answered, by endpoint and HTTP status.",
                     "# TYPE strata_requests_total counter"]
            lines += [f'strata_requests_total{{endpoint="{endpoint}",status="{status}"}} {count}'
                      for (endpoint, status), count in sorted(self.requests.items())]
            lines += _described("counter", (
                ("prompt_tokens_total", self.prompt_tokens, "Prompt tokens of answered requests."),
                ("cached_prompt_tokens_total", self.cached_tokens, "Prompt tokens a session already held."),
                ("generated_tokens_total", self.generated_tokens, "Tokens generated."),
                ("drafted_tokens_total", self.drafted_tokens, "Tokens drafted and verified."),
                ("accepted_tokens_total", self.accepted_tokens, "Drafted tokens accepted.")))
            lines += _described("gauge", (
                ("queue_depth", pool.waiting, "Requests waiting for a session."),
                ("busy_sessions", pool.busy, "Sessions generating."),
                ("sessions", len(pool.sessions), "Sessions."),
                ("decode_tokens_per_second", round(self.decode_tokens_per_second, 3),
                 "Decode speed of the last answer of more than one token.")))
            lines += self.time_to_first_token.lines(
                "time_to_first_token_seconds", "From a request's arrival (queue and prompt included) to its first "
                                               "token.")
            lines += self.inter_token.lines("inter_token_latency_seconds",
                                            "Between two consecutive tokens of an answer, as generated.")
            lines += self.queue_depth.lines("queue_depth_on_arrival",
                                            "Requests waiting for a session as each request arrived, itself "
                                            "included where it waited.")
        if batcher is not None:
            counts = batcher.stats()
            lines += _described("counter", (
                ("decode_batches_total", counts["decode_batches"],
                 "Decode steps run: sessions' steps stepped together, or one alone."),
                ("decode_rows_total", counts["decode_rows"],
                 "Sessions' decode steps in them (rows / batches: the mean batch)."),
                ("prompt_chunks_total", counts["prompt_chunks"], "Prompt chunks run between the decode steps."),
                ("compute_busy_seconds_total", round(counts["busy_seconds"], 6),
                 "Seconds the compute thread spent in engine calls."),
                ("compute_gathering_seconds_total", round(counts["gathering_seconds"], 6),
                 "Seconds the compute thread waited, a decode step in, for the other steps of its batch.")))
            buckets, total = counted(ROWS_BUCKETS, counts["batch_sizes"])
            lines += _histogram_lines("decode_batch_rows", "Sessions' decode steps per engine call.", ROWS_BUCKETS,
                                      buckets, total)
            lines += _described("gauge", (("batch_limit", batcher.max_batch, "The most sessions stepped together."),))
        return "\n".join(lines) + "\n"


def _described(kind: str, metrics) -> list[str]:
    """Each (name, value, help) of `metrics` as Prometheus text lines of type `kind`."""
    lines = []
    for name, value, what in metrics:
        lines += [f"# HELP strata_{name} {what}", f"# TYPE strata_{name} {kind}", f"strata_{name} {value}"]
    return lines


def _histogram_lines(name: str, what: str, bounds: Sequence[float], counts: Sequence[int], total: float) -> list[str]:
    """A histogram's text: HELP, TYPE, a cumulative `_bucket` per bound and +Inf, `_sum`, `_count`."""
    lines = [f"# HELP strata_{name} {what}", f"# TYPE strata_{name} histogram"]
    running = 0
    for bound, count in zip((*bounds, float("inf")), counts):
        running += count
        lines.append(f'strata_{name}_bucket{{le="{_le(bound)}"}} {running}')
    return lines + [f"strata_{name}_sum {round(total, 6)}", f"strata_{name}_count {running}"]


def _le(bound: float) -> str:
    """A bucket bound as Prometheus' clients write it: +Inf, a count as an integer, a time as a float."""
    if bound == float("inf"):
        return "+Inf"
    return str(bound) if isinstance(bound, int) else repr(float(bound))
