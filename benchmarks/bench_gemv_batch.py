"""The routed experts' GEMVs from the VRAM cache (docs/rows.md): a batch of products over a stack of expert
matrices, as a decode token runs its 10 (top-k) and a step of R rows its R x 10, at each row split the kernels
offer (warps per weight row: 1, 2 or 4; "rule" is the kernels' own choice, gemv_rows.cuh), side by side in one
process.

    python benchmarks/bench_gemv_batch.py [--quick] [--reps 20] [--counts 10,40,80,160] [--json PATH]

Times as bench_gemv.py's (CUDA events, median of --reps, the L2 cold). The shapes are the benchmark model's
(qwen4exp) experts in its mix: gate and up 640 x 2560 in Q4_K, down 2560 x 640 in Q4_0. Bytes moved are the
products' weight planes; GB/s and % are of them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T

from strata import _native_check

from bench_gemv import PEAK_BYTES_PER_S, random_weight  # the cold-L2 timing's weights

N_MATRIX = 32  # distinct experts in the stack: the products cycle over them
SHAPES = [("gate / up", T.Q4_K, 640, 2560), ("down", T.Q4_0, 2560, 640)]
SPLITS = {"rule": 0, "1": 1, "2": 2, "4": 4}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="few reps, counts 10 and 80 (a smoke run)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--counts", default="10,40,80,160")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    reps = 3 if args.quick else args.reps
    counts = [10, 80] if args.quick else [int(c) for c in args.counts.split(",") if c]
    rng = np.random.default_rng(0)
    results = []
    print(f"{'matrix':10} {'format':6} {'count':>5} " + " ".join(f"{'split ' + k:>10}" for k in SPLITS) +
          f" {'best GB/s':>9} {'% 4.2TB/s':>9}")
    for name, ggml_type, rows, cols in SHAPES:
        stack = random_weight(ggml_type, N_MATRIX * rows, cols, rng)
        per_matrix = stack.nbytes / N_MATRIX
        for count in counts:
            us = {k: _native_check.time_gemv_batch(stack, N_MATRIX, count, split, reps) * 1e6
                  for k, split in SPLITS.items()}
            best = min(us.values())
            gbps = per_matrix * count / best / 1e3
            results.append({"matrix": name, "format": ggml_type.name, "rows": rows, "cols": cols, "count": count,
                            "bytes": per_matrix * count, "us": us})
            print(f"{name:10} {ggml_type.name:6} {count:5d} " + " ".join(f"{us[k]:10.2f}" for k in SPLITS) +
                  f" {gbps:9.0f} {100 * gbps * 1e9 / PEAK_BYTES_PER_S:9.1f}")
            print(f"RESULT gemv_batch {name} x{count}: rule {us['rule']:.1f} us, best {best:.1f} us "
                  f"(split {min(us, key=us.get)}), {gbps:.0f} GB/s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
