"""Prompt processing speed: the prompt path's time to first token at a few prompt lengths, beside stepping the
same ids token by token, and its streaming limit (the bytes the staging copied at the measured PCIe rate)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from strata.bench.decode import prompt_ids
from strata.errors import InvalidArgument
from strata.options import KV

if TYPE_CHECKING:
    import numpy as np

STEPPED_TOKENS = 64  # the token-by-token figure beside a prompt: its first ids, stepped


def prompt_speed(model: Any, lengths: list[int], kv: KV, rng: np.random.Generator, upload_rate: float,
                 kv_streaming: bool = False, steering: Mapping[str, Any] | None = None) -> list[dict[str, float]]:
    """Per length n: n random ids through the prompt path (the feed samples the next token, so its time is the
    time to first token) and their first STEPPED_TOKENS stepped token by token, each from an empty sequence; the
    bytes the staging copied and their floor at `upload_rate` (pinned host -> device bytes/s, measured here: the
    streaming limit). `steering`: Model.session's control_vectors and control_layers, for both sessions."""
    from strata.sampling import SamplingParams

    g = model.info.geometry
    context = min(g.context_length, max(lengths) + 1)
    greedy = SamplingParams()
    results = []
    steering = steering or {}
    with model.session(context, kv=kv, snapshots=0, kv_streaming=kv_streaming, **steering) as chunked, \
            model.session(context, kv=kv, snapshots=0, prompt_chunk=0, kv_streaming=kv_streaming,
                          **steering) as stepped:
        chunk = chunked.engine.prompt_chunk
        if not chunk:
            raise InvalidArgument("this model has no prompt path (load it with prompt=True and room for the staging)")

        def feed(ids: list[int]) -> float:
            chunked.reset()
            start = time.perf_counter()
            chunked.engine.feed_prompt_path(ids, greedy, 0.0, ids)  # every length, below the path's threshold too
            return time.perf_counter() - start

        feed(prompt_ids(g, min(STEPPED_TOKENS, context), rng))  # warm-up: kernels, graphs, the staging's first pages
        for n in lengths:
            ids = prompt_ids(g, n, rng)
            seconds = feed(ids)
            staged = chunked.engine_stats["prompt_staged_bytes"]  # reset() starts the sums over
            m = min(n, STEPPED_TOKENS)
            stepped.reset()
            start = time.perf_counter()
            stepped.engine.prefill(ids[:m], ids[:m])
            stepped_rate = m / (time.perf_counter() - start)
            floor = staged / upload_rate
            results.append({"tokens": n, "chunk": chunk, "seconds": seconds, "tokens_per_second": n / seconds,
                            "staged_bytes": staged, "pcie_bytes_per_second": upload_rate,
                            "pcie_floor_seconds": floor, "fraction_of_limit": floor / seconds,
                            "stepped_tokens_per_second": stepped_rate})
    return results


def prompt_report(rows: list[Mapping[str, float]]) -> list[str]:
    """The human-readable lines of prompt_speed's rows."""
    chunk = rows[0]["chunk"] if rows else 0
    pcie = f", PCIe {rows[0]['pcie_bytes_per_second'] / 1e9:.1f} GB/s measured here" if rows else ""
    lines = [f"{'prompt':>7s} {'tok/s':>8s} {'ttft s':>7s} {'staged GB':>9s} {'PCIe floor s':>12s} {'of limit':>8s} "
             f"{'stepped tok/s':>13s} {'speedup':>7s}   (prompt path, chunk {chunk}{pcie})"]
    for r in rows:
        speedup = r["tokens_per_second"] / r["stepped_tokens_per_second"]
        lines.append(f"{r['tokens']:7d} {r['tokens_per_second']:8.0f} {r['seconds']:7.3f} "
                     f"{r['staged_bytes'] / 1e9:9.2f} {r['pcie_floor_seconds']:12.3f} {r['fraction_of_limit']:8.1%} "
                     f"{r['stepped_tokens_per_second']:13.1f} {speedup:6.1f}x")
    return lines
