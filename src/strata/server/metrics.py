"""The server's counters in Prometheus' text format: requests by endpoint and status, tokens in and out, drafted
and accepted tokens, the queue, the sessions, decode speed and time to first token, and where sessions step
together their batches."""

from __future__ import annotations

import threading
from collections import Counter

from strata.generation import Stats


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.prompt_tokens = self.cached_tokens = self.generated_tokens = 0
        self.drafted_tokens = self.accepted_tokens = 0
        self.first_token_seconds = 0.0
        self.first_tokens = 0
        self.decode_tokens_per_second = 0.0

    def answered(self, endpoint: str, status: int, stats: Stats | None = None) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1
            if stats is not None:
                self.prompt_tokens += stats.prompt_tokens
                self.cached_tokens += stats.cached_tokens
                self.generated_tokens += stats.generated_tokens
                self.drafted_tokens += stats.drafted
                self.accepted_tokens += stats.accepted
                if stats.generated_tokens:
                    self.first_token_seconds += stats.prefill_seconds
                    self.first_tokens += 1
                if stats.generated_tokens > 1:
                    self.decode_tokens_per_second = stats.decode_tokens_per_second

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
            lines += ["# HELP strata_time_to_first_token_seconds Prompt processing until the first token.",
                      "# TYPE strata_time_to_first_token_seconds summary",
                      f"strata_time_to_first_token_seconds_sum {self.first_token_seconds:.6f}",
                      f"strata_time_to_first_token_seconds_count {self.first_tokens}"]
        if batcher is not None:
            counts = batcher.stats()
            lines += _described("counter", (
                ("decode_batches_total", counts["decode_batches"],
                 "Decode steps run: sessions' steps stepped together, or one alone."),
                ("decode_rows_total", counts["decode_rows"],
                 "Sessions' decode steps in them (rows / batches: the mean batch)."),
                ("prompt_chunks_total", counts["prompt_chunks"], "Prompt chunks run between the decode steps.")))
            lines += _described("gauge", (("batch_limit", batcher.max_batch, "The most sessions stepped together."),))
        return "\n".join(lines) + "\n"


def _described(kind: str, metrics) -> list[str]:
    """Each (name, value, help) of `metrics` as Prometheus text lines of type `kind`."""
    lines = []
    for name, value, what in metrics:
        lines += [f"# HELP strata_{name} {what}", f"# TYPE strata_{name} {kind}", f"strata_{name} {value}"]
    return lines
