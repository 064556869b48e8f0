"""Prompt processing on the GPU box: the prompt path (chunks, routed experts staged over PCIe) against feeding
the same ids token by token, on one model file, in one run.

    python3 benchmarks/bench_prompt.py MODEL.gguf [--lengths 512,4096] [--chunk 4096] [--json PATH]

For each length: the prompt path's tok/s and time to first token (the feed samples the first new token), the
bytes the staging copied and their floor at the measured PCIe rate (the streaming limit), and the token-by-token
rate on the first 64 ids (the decode path a prompt took before). Every routed expert is on the CPU pool for the
token-by-token run and in the staging for the prompt path (expert_cache=0).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import strata
from strata.sampling import SamplingParams

PCIE_BYTES_PER_SECOND = 55e9  # the box's pinned host -> device rate (README: measured ceilings)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--lengths", default="512,4096")
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--json")
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    model = strata.load(args.model, expert_cache=0, progress=True)
    g = model.info.geometry
    rng = np.random.default_rng(0)
    results = []
    context = max(lengths) + 256
    for n in lengths:
        ids = [int(t) for t in rng.integers(0, g.n_vocab, n)]
        if g.ple_layers:
            ids = [t if t != g.ple_eos else t - 1 for t in ids]
        session = model.session(context=context, prompt_chunk=args.chunk, snapshots=0)
        engine = session.engine
        engine.prefill(ids[:64], ids[:64])  # warm-up: graphs, staging pages, kernels
        engine.reset()
        start = time.perf_counter()
        engine.feed(ids, SamplingParams(), 0.0, ids)
        seconds = time.perf_counter() - start
        st = engine.stats()
        staged = st["prompt_staged_bytes"]
        floor = staged / PCIE_BYTES_PER_SECOND
        stepped = model.session(context=context, prompt_chunk=0, snapshots=0).engine
        m = min(64, n)
        start = time.perf_counter()
        stepped.prefill(ids[:m], ids[:m])
        step_rate = m / (time.perf_counter() - start)
        r = {"tokens": n, "chunk": engine.native.prompt_chunk, "seconds": seconds, "tok_s": n / seconds,
             "staged_gb": staged / 1e9, "pcie_floor_s": floor, "of_limit": floor / seconds,
             "token_by_token_tok_s": step_rate, "chunks": st["prompt_chunks"]}
        results.append(r)
        print(f"RESULT prompt {n} tokens (chunk {r['chunk']}, {r['chunks']} chunks): {r['tok_s']:.0f} tok/s, "
              f"ttft {seconds:.2f} s; staged {r['staged_gb']:.1f} GB, PCIe floor {floor:.2f} s "
              f"({100 * r['of_limit']:.0f} % of the streaming limit); token by token {step_rate:.1f} tok/s "
              f"({r['tok_s'] / step_rate:.1f}x)", flush=True)
        session.close()
        stepped.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
