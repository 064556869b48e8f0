"""The prompt path with and without the CPU pool's share of small chunks, beside decode, on one model file in
one run (docs/performance.md, "Prompt processing").

    python3 benchmarks/bench_prompt_cpu.py MODEL.gguf [--lengths 2,4,8,16,32,64,128,512,4096] [--json PATH]

First `strata bench`'s run (token_graph decode of 64 tokens, then the prompt path at every length beside
stepping), then the prompt path again at the lengths below 256 with `prompt_cpu=False`. Every routed expert
starts on the CPU pool (expert_cache=0).
"""

from __future__ import annotations

import argparse
import functools
import json

import numpy as np

import strata
from strata.bench.prompt import prompt_report, prompt_speed
from strata.bench.run import run
from strata.options import KV

SMALL = 256  # lengths past this touch every expert: the pool's share does not apply there


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--lengths", default="2,4,8,16,32,64,128,512,4096")
    parser.add_argument("--json")
    args = parser.parse_args()
    lengths = tuple(int(n) for n in args.lengths.split(","))
    with strata.load(args.model, expert_cache=0, progress=False) as model:
        result = run(model, model_path=args.model, modes=["token_graph"], prompt_tokens=16, tokens=64, emit=print,
                     prompt_lengths=lengths)
        model.session = functools.partial(model.session, prompt_cpu=False)
        alone = prompt_speed(model, [n for n in lengths if n < SMALL], KV.INT8, np.random.default_rng(1),
                             result["rates"]["pcie_upload"])
    print("without the pool's share")
    print("\n".join(prompt_report(alone)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**result, "prompt_without_cpu": alone}, f, indent=1)


if __name__ == "__main__":
    main()
