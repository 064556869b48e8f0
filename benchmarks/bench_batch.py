"""Batched sessions (docs/batch.md): aggregate decode speed of B sessions stepped together against one alone.

    python3 benchmarks/bench_batch.py [MODEL.gguf] [--expert-cache 0,auto] [--sizes 1,2,4,8,16] [--tokens 32]
        [--json PATH]

Without MODEL, `strata bench`'s default benchmark model (synthesized once into the cache). For each expert cache
budget: sessions of 1024 tokens (token graph, KV int8) with the prompt path; one session's plain greedy decode
steps, then greedy decode of every batch size's sessions at once (strata.bench.batch.batch_sweep), each from its
own random prompt.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

import strata
from strata.bench.batch import batch_sweep
from strata.bench.decode import prompt_ids
from strata.bench.default_model import bench_model, cache_dir
from strata.synth import synthesize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--expert-cache", default="0,auto")
    parser.add_argument("--sizes", default="1,2,4,8,16")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    path = args.model or bench_model(cache_dir(), synthesize)
    sizes = [int(x) for x in args.sizes.split(",") if x]
    results = {}
    for budget in args.expert_cache.split(","):
        model = strata.load(path, progress=False, expert_cache=0 if budget == "0" else budget)
        g = model.info.geometry
        try:
            prompts = {}

            def prompt(i: int) -> list[int]:
                if i not in prompts:
                    prompts[i] = prompt_ids(g, 16 + 3 * i, np.random.default_rng(100 + i))
                return prompts[i]

            got = batch_sweep(lambda: model.session(1024), prompt, sizes, args.tokens)
        finally:
            model.close()
        results[budget] = got
        print(f"RESULT cache={budget} plain {got['plain_tokens_per_second']:.2f} tok/s; " +
              "; ".join(f"B={b} {v['tokens_per_second']:.2f} tok/s ({v['speedup']:.2f}x, step "
                        f"{v['step_ms_median']:.2f} ms)" for b, v in got["batches"].items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
