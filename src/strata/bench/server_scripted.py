"""An engine whose calls take stated times, for measuring the served path without a GPU (benchmarks/bench_server.py
--engine scripted): what the server, the Batcher and the streams add between decode steps, against a step whose
cost is known. A decode step alone takes `lone` seconds, a batched step of n rows `batch + row * n`, a prompt piece
of n ids `batch + prompt_token * n`; each waits in time.sleep, which lets go of the GIL as the native step does
(the GPU engine's step and step_batch run without it). Its tokens are a function of the sequence (the last id and
the position), never an EOS, so an answer runs to its max_tokens; the text is the given tokenizer's."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from strata.errors import InvalidArgument
from strata.sampling import SamplingParams

# The GPU box's step of several rows with every expert in VRAM (docs/performance.md, "Batched sessions",
# 2026-12-06, ninth session, H100): a plain step 2.5-2.8 ms, a step of B rows about 2.04 + 0.47 B ms (8 rows 5.78
# ms, 16 rows 9.52); prompt pieces at ~10,000 tokens a second.
LONE_SECONDS = 2.5e-3
BATCH_SECONDS = 2.04e-3
ROW_SECONDS = 0.47e-3
PROMPT_TOKEN_SECONDS = 0.1e-3
PROMPT_CHUNK = 512   # the GPU engine's prompt chunk, as the Batcher splits a prompt
MAX_BATCH = 16       # GpuEngine.max_batch (_native.MAX_STEP_ROWS)


@dataclass(frozen=True)
class StepCosts:
    """Seconds of each engine call (the defaults: the GPU box, every expert in VRAM)."""

    lone: float = LONE_SECONDS
    batch: float = BATCH_SECONDS
    row: float = ROW_SECONDS
    prompt_token: float = PROMPT_TOKEN_SECONDS

    def __post_init__(self) -> None:
        if min(self.lone, self.batch, self.row, self.prompt_token) < 0:
            raise InvalidArgument(f"step costs must be >= 0 seconds, got {self}")

    def __str__(self) -> str:
        return (f"{self.lone * 1e3:g} ms alone, {self.batch * 1e3:g} + {self.row * 1e3:g} ms a row batched, "
                f"{self.prompt_token * 1e3:g} ms a prompt token")

    def rows(self, n: int) -> float:
        return self.batch + self.row * n

    def prompt(self, n: int) -> float:
        return self.batch + self.prompt_token * n


class TimedEngine:
    """The Engine protocol (feed, prefill, reset, position, context) and the batched step (batch_key, max_batch,
    step_batch), each call sleeping its stated cost. `vocab` ids, `avoid` (the EOS ids) never produced."""

    prompt_min_tokens = 1

    def __init__(self, vocab: int, context: int, costs: StepCosts, avoid: Sequence[int] = (), *,
                 prompt_chunk: int = PROMPT_CHUNK, max_batch: int = MAX_BATCH, batch_key: object = "scripted"):
        if vocab < len(set(avoid)) + 2 or context < 2:
            raise InvalidArgument(f"a timed engine needs a vocabulary of >= 2 ids it may produce and a context of "
                                  f">= 2, got {vocab} ids less {len(set(avoid))} and {context}")
        self.allowed = [t for t in range(vocab) if t not in set(avoid)]
        self.context, self.costs = context, costs
        self.prompt_chunk, self.max_batch, self.batch_key = prompt_chunk, max_batch, batch_key
        self.position = 0

    def _next(self, seen: Sequence[int]) -> int:
        return self.allowed[(seen[-1] * 31 + len(seen) * 7) % len(self.allowed)]

    def _fed(self, ids: Sequence[int], seen: Sequence[int]) -> None:
        if not ids or len(seen) != self.position + len(ids) or len(seen) > self.context:
            raise InvalidArgument(f"feed of {len(ids)} ids with {len(seen)} seen at position {self.position} "
                                  f"(context {self.context})")
        self.position += len(ids)

    def feed(self, ids: Sequence[int], params: SamplingParams, u: float, seen: Sequence[int]) -> int:
        time.sleep(self.costs.lone if len(ids) == 1 else self.costs.prompt(len(ids)))
        self._fed(ids, seen)
        return self._next(seen)

    def prefill(self, ids: Sequence[int], seen: Sequence[int]) -> None:
        time.sleep(self.costs.prompt(len(ids)))
        self._fed(ids, seen)

    @staticmethod
    def step_batch(engines: Sequence[TimedEngine], ids: Sequence[int], params: Sequence[SamplingParams],
                   us: Sequence[float], seens: Sequence[Sequence[int]]) -> list[int]:
        time.sleep(engines[0].costs.rows(len(engines)))
        out = []
        for engine, token, seen in zip(engines, ids, seens, strict=True):
            engine._fed([token], seen)
            out.append(engine._next(seen))
        return out

    def reset(self) -> None:
        self.position = 0
