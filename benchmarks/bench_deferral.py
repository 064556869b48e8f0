"""Expert deferral's speed and its cost in accuracy (docs/session.md, "Expert deferral").

    python3 benchmarks/bench_deferral.py [MODEL.gguf] [--defer 0,1,2,3,4] [--tokens 128] [--mode token_graph]
        [--json PATH]

Without MODEL, `strata bench`'s default benchmark model (synthesized once into the cache). Every routed expert
stays on the CPU pool (expert_cache=0). First d = 0 decodes `tokens` tokens greedily after a short random
prompt; that token sequence is then fed (forced) to a fresh session of every d, so all of them see the same
inputs. Per d: decode tok/s (the steps alone, timed; the logits are read between them) with the per-token ring
wait and pool time, and max and mean |logit difference| against d = 0 over the sequence, also relative to the
largest |logit|; how often the argmax differs.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import strata
from strata.bench.decode import prompt_ids
from strata.bench.default_model import bench_model, cache_dir
from strata.sampling import SamplingParams

PROMPT_TOKENS = 16


def forced(model, ids: list[int], defer: int, mode: str) -> tuple[np.ndarray, dict[str, float]]:
    """A fresh session of `defer` stepped through `ids`: the logits after each, and the steps' speed."""
    session = model.session(len(ids) + 1, mode=mode, snapshots=0, prompt_chunk=0, defer_experts=defer)
    engine = session.engine
    try:
        logits = np.empty((len(ids), model.info.geometry.n_vocab), dtype=np.float32)
        seconds = 0.0
        for i, token in enumerate(ids):
            seen = ids[: i + 1]
            start = time.perf_counter()
            engine.prefill([token], seen)
            seconds += time.perf_counter() - start
            logits[i] = engine.logits()
        stats = engine.stats()
        tokens = len(ids)
        timing = {"tokens_per_second": tokens / seconds, "ms_per_token": 1e3 * seconds / tokens,
                  "ring_wait_ms": 1e3 * stats["ring_wait_seconds"] / tokens,
                  "pool_ms": 1e3 * stats["pool_seconds"] / tokens}
        return logits, timing
    finally:
        session.close()


def greedy_sequence(model, prompt: list[int], tokens: int, mode: str) -> list[int]:
    """The prompt and the `tokens` ids d = 0 picks greedily after it."""
    session = model.session(len(prompt) + tokens + 1, mode=mode, snapshots=0, prompt_chunk=0)
    try:
        engine, history = session.engine, list(prompt)
        token = engine.feed(prompt, SamplingParams(), 0.0, history)
        for _ in range(tokens):
            history.append(token)
            token = engine.feed([token], SamplingParams(), 0.0, history)
        return history
    finally:
        session.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--defer", default="0,1,2,3,4", help="the d to measure, 0 first (the exact reference)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--mode", default="token_graph")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    defers = sorted({0, *(int(d) for d in args.defer.split(","))})
    if args.model is None:
        from strata.synth import synthesize

        args.model = str(bench_model(cache_dir(), synthesize))
    rows = []
    with strata.load(args.model, expert_cache=0, progress=False) as model:
        g = model.info.geometry
        ids = greedy_sequence(model, prompt_ids(g, PROMPT_TOKENS, np.random.default_rng(0)), args.tokens, args.mode)
        forced(model, ids[:PROMPT_TOKENS], 0, args.mode)  # warm-up: kernels, graphs, the pool's pages
        exact = None
        for d in defers:
            logits, timing = forced(model, ids, d, args.mode)
            if exact is None:
                exact = logits
            diff = np.abs(logits - exact)
            scale = np.abs(exact).max(axis=1)
            rows.append({"defer_experts": d, **timing, "max_abs_logit_diff": float(diff.max()),
                         "mean_abs_logit_diff": float(diff.mean()),
                         "max_relative_logit_diff": float((diff.max(axis=1) / scale).max()),
                         "argmax_changed": float(np.mean(logits.argmax(axis=1) != exact.argmax(axis=1)))})
    base = rows[0]["tokens_per_second"]
    print(f"{args.model}: {g.arch}, {g.n_layer} layers, k = {g.n_expert_used}; {len(ids)} forced tokens, "
          f"mode {args.mode}")
    print(f"{'d':>3}{'tok/s':>9}{'speedup':>9}{'ms/tok':>9}{'ring wait':>11}{'pool':>8}{'max|dl|':>10}"
          f"{'mean|dl|':>10}{'max rel':>9}{'argmax':>8}")
    for r in rows:
        print(f"{r['defer_experts']:3d}{r['tokens_per_second']:9.2f}{r['tokens_per_second'] / base:8.3f}x"
              f"{r['ms_per_token']:9.3f}{r['ring_wait_ms']:11.3f}{r['pool_ms']:8.3f}{r['max_abs_logit_diff']:10.4f}"
              f"{r['mean_abs_logit_diff']:10.5f}{r['max_relative_logit_diff']:9.4f}{r['argmax_changed']:8.1%}")
    for r in rows:
        print(f"RESULT deferral d={r['defer_experts']}: {r['tokens_per_second']:.2f} tok/s "
              f"({r['tokens_per_second'] / base:.3f}x of d=0), max |logit diff| {r['max_abs_logit_diff']:.4f}, "
              f"mean {r['mean_abs_logit_diff']:.5f}, argmax changed {r['argmax_changed']:.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "mode": args.mode, "tokens": len(ids), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
