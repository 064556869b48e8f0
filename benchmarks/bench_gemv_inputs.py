"""A step's dense products (docs/rows.md): one matrix times R rows of activations, as one multi-input GEMV (each
weight block read and decoded once for every row) against a batch of R products of the matrix (each product
decoding it again, the later ones reading it from L2), side by side in one process.

    python benchmarks/bench_gemv_inputs.py [--quick] [--reps 30] [--rows 1,2,4,8] [--json PATH]

Times as bench_gemv.py's (CUDA events, median of --reps, the L2 cold). The shapes are the benchmark model's
(qwen4exp) GDN and attention projections, the shared expert and the LM head, in the formats of its dense part
(Q8_0) and of a K-quant (Q4_K). "integer us" is the multi-input GEMV's integer walk (16 rows: two launches of
8), "tensor us" the tensor cores' (Q8_0, Q5_0, Q4_0), "inputs us" the kernel the launcher picks (the tensor cores
from kMmaMinInputs rows, up to 16 in one launch; kernels/gemv.cuh), "x one row" its time over the one-row GEMV's:
a step of R rows pays it for its dense part, where R separate decode steps pay R. The router's float weight last:
a batch of R products of it against gemv_float_inputs (each row of the weight read once for every input).
"""

from __future__ import annotations

import json

import numpy as np
from gguf import GGMLQuantizationType as T

from strata import _native_check

from bench_gemv import PEAK_BYTES_PER_S, ROUTER, bench_arguments, random_weight  # the cold-L2 timing's weights

SHAPES = [("attn_qkvz", 2560, 16384), ("ssm_out", 6144, 2560), ("attn_q", 2560, 12288),
          ("ffn_up_shexp", 2560, 640), ("ffn_down_shexp", 640, 2560), ("output (LM head)", 2560, 248320)]
FORMATS = {"Q8_0": T.Q8_0, "Q4_K": T.Q4_K}
TENSOR_CORE_FORMS = (T.Q8_0, T.Q5_0, T.Q4_0)  # kernels/gemv_quant_mma.cuh (every shape here an even count of blocks)


def main() -> None:
    args = bench_arguments(__doc__, "few reps, no LM head", 30)
    reps = 3 if args.quick else args.reps
    rng = np.random.default_rng(0)
    counts = [1, 2, 4, 8, 16]
    results = []
    print(f"{'tensor':18} {'format':6} {'rows':>4} {'batch us':>9} {'integer us':>10} {'tensor us':>9} "
          f"{'inputs us':>9} {'x one row':>9} {'GB/s':>7} {'% 4.2TB/s':>9}")
    for name, n_in, n_out in SHAPES[:-1] if args.quick else SHAPES:
        for fmt, ggml_type in FORMATS.items():
            if ggml_type == T.Q4_K and n_in % 256:
                ggml_type = T.Q4_0
            w = random_weight(ggml_type, n_out, n_in, rng)
            # 16 rows in one launch where the tensor cores take the form; the integer walk takes 8 at a time
            most = 16 if ggml_type in TENSOR_CORE_FORMS else 8
            batch, inputs = _native_check.time_gemv_inputs(w, most, reps)
            _, integer = _native_check.time_gemv_inputs(w, 8, reps, kernel="integer")
            tensor = (_native_check.time_gemv_inputs(w, most, reps, kernel="tensor_cores")[1]
                      if ggml_type in TENSOR_CORE_FORMS else np.full(most, np.nan))
            for rows in (c for c in counts if c <= most):
                integer_us = integer[rows - 1] if rows <= 8 else 2 * integer[rows // 2 - 1]  # two launches
                r = {"tensor": name, "format": ggml_type.name, "in": n_in, "out": n_out, "rows": rows,
                     "bytes": w.nbytes, "batch_us": batch[rows - 1] * 1e6, "integer_us": integer_us * 1e6,
                     "tensor_us": tensor[rows - 1] * 1e6, "inputs_us": inputs[rows - 1] * 1e6,
                     "of_one_row": inputs[rows - 1] / batch[0]}
                results.append(r)
                gbps = w.nbytes / inputs[rows - 1] / 1e9
                print(f"{name:18} {ggml_type.name:6} {rows:4d} {r['batch_us']:9.2f} {r['integer_us']:10.2f} "
                      f"{r['tensor_us']:9.2f} {r['inputs_us']:9.2f} {r['of_one_row']:9.2f} {gbps:7.0f} "
                      f"{100 * gbps * 1e9 / PEAK_BYTES_PER_S:9.1f}")
    name, n_in, n_out = ROUTER
    router = random_weight(T.F32, n_out, n_in, rng)
    batch, inputs = _native_check.time_gemv_inputs(router, 16, reps)
    for rows in counts:
        print(f"{name:18} {'F32':6} {rows:4d} {batch[rows - 1] * 1e6:9.2f} {'':>10} {'':>9} "
              f"{inputs[rows - 1] * 1e6:9.2f} {inputs[rows - 1] / batch[0]:9.2f}")
    print("RESULT router " + ", ".join(f"{rows} rows: batch {batch[rows - 1] * 1e6:.1f} us, inputs "
                                      f"{inputs[rows - 1] * 1e6:.1f} us" for rows in counts[1:]))
    for rows in counts[1:]:
        chosen = [r for r in results if r["rows"] == rows]  # at 16, the forms of the tensor cores only
        batch, inputs = sum(r["batch_us"] for r in chosen), sum(r["inputs_us"] for r in chosen)
        integer = sum(r["integer_us"] for r in chosen)
        cores = [r for r in chosen if not np.isnan(r["tensor_us"])]  # the forms the tensor cores take
        print(f"RESULT gemv {rows} rows: batch of products {batch:.1f} us, integer multi-input {integer:.1f} us, "
              f"chosen multi-input {inputs:.1f} us ({batch / inputs:.2f}x the batch, {integer / inputs:.2f}x "
              f"the integer walk); where the tensor cores take the form, integer "
              f"{sum(r['integer_us'] for r in cores):.1f} us against tensor cores "
              f"{sum(r['tensor_us'] for r in cores):.1f} us")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
