"""Matrix products on tensor cores (kernels/matmul.cuh), the prompt path's projections and routed experts.

    python benchmarks/bench_matmul.py [--quick] [--reps 20] [--json PATH]

Dense: Q8_0 2560 -> 16384 (qwen4exp's largest projections), and a routed expert's gate in Q4_K (2560 -> 640) and
down in Q4_0 (640 -> 2560: its 640 columns are no whole Q4_K super-blocks, so llama-quantize writes Q4_0), at
T = 512 and 4096 rows. Grouped: the same expert shapes over a stack of 512 experts, 80 rows each (40960 rows,
one launch). Each launch is timed with CUDA events (median of --reps batches of 8 launches; the L2 stays warm,
as a product re-reads its weight tiles per tile of rows anyway). TFLOP/s counts 2 * rows * cols multiply-adds
per X row; GB/s counts what a launch must move at least once: the weight planes (all 512 experts' for the
grouped case), X as q8_32 (xq and dx) and Y.
"""

from __future__ import annotations

import json

import numpy as np
from gguf import GGMLQuantizationType as T

from strata import _native_check

from bench_gemv import bench_arguments, random_weight  # random codes with small finite scales, as the GEMV's

DENSE = [("Q8_0 2560->16384", T.Q8_0, 2560, 16384), ("Q4_K 2560->640", T.Q4_K, 2560, 640),
         ("Q4_0 640->2560", T.Q4_0, 640, 2560)]
ROW_COUNTS = (512, 4096)
EXPERTS, ROWS_PER_EXPERT = 512, 80


def measure(name: str, ggml_type: T, n_in: int, n_out: int, count: int, experts: int, reps: int, rng) -> dict:
    """One product's timing: dense (experts 0) or `experts` groups of count / experts rows over as many matrices."""
    stack = random_weight(ggml_type, max(experts, 1) * n_out, n_in, rng)
    seconds = _native_check.time_matmul(stack, max(experts, 1), count, experts, reps)
    nbytes = stack.nbytes + count * n_in * (1 + 4 / 32) + count * n_out * 4
    flops = 2.0 * count * n_out * n_in
    return {"case": name, "format": ggml_type.name, "in": n_in, "out": n_out, "rows": count, "experts": experts,
            "us": seconds * 1e6, "tflop_per_s": flops / seconds / 1e12, "gb_per_s": nbytes / seconds / 1e9}


def main() -> None:
    args = bench_arguments(__doc__, "few reps, 64 experts", 20)
    reps = 3 if args.quick else args.reps
    experts = 64 if args.quick else EXPERTS
    rng = np.random.default_rng(0)
    results = [measure(name, t, n_in, n_out, count, 0, reps, rng)
               for name, t, n_in, n_out in DENSE for count in ROW_COUNTS]
    results += [measure(f"{name} x {experts} experts", t, n_in, n_out, experts * ROWS_PER_EXPERT, experts, reps, rng)
                for name, t, n_in, n_out in DENSE[1:]]
    print(f"{'case':34} {'rows':>6} {'us':>10} {'TFLOP/s':>8} {'GB/s':>7}")
    for r in results:
        print(f"{r['case']:34} {r['rows']:6} {r['us']:10.1f} {r['tflop_per_s']:8.1f} {r['gb_per_s']:7.0f}")
    for r in results:
        print(f"RESULT matmul {r['case']} T={r['rows']}: {r['tflop_per_s']:.1f} TFLOP/s, {r['gb_per_s']:.0f} GB/s "
              f"({r['us']:.0f} us)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
