"""Batch-1 GEMV bandwidth: the projections of one qwen4exp layer and the LM head, in Q8_0, Q4_K and BF16.

    python benchmarks/bench_gemv.py [--quick] [--reps 30] [--json PATH]

Each GEMV is timed with CUDA events (median of --reps batches) with the L2 cold: launches cycle through
enough device copies of the weight to overflow the cache, as a decode step that reads each weight once.
Bytes moved are the weight planes (x and y are negligible). Percentages are of 4.2 TB/s, the copy bandwidth
measured on the H200 box. Rows narrower than a K-quant super-block (320, 640) use Q4_0 in the Q4_K column,
as llama-quantize does.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T

from strata import _native_check
from strata.quant import QuantTensor, form_for
from strata.quant.tensor import plane_layout

PEAK_BYTES_PER_S = 4.2e12
# (name, in, out) of one qwen4exp layer (docs/models/qwen4exp.md): GDN, attention, HC, shared expert.
LAYER = [
    ("attn_qkv", 2560, 10240), ("attn_gate", 2560, 6144), ("ssm_beta", 2560, 48), ("ssm_alpha", 2560, 48),
    ("ssm_out", 6144, 2560), ("attn_q", 2560, 12288), ("attn_k", 2560, 512), ("attn_v", 2560, 512),
    ("attn_output", 6144, 2560), ("hc_down", 10240, 320), ("hc_up", 320, 10240), ("hc_inject", 10240, 4),
    ("ffn_gate_shexp", 2560, 640), ("ffn_up_shexp", 2560, 640), ("ffn_down_shexp", 640, 2560),
]
ROUTER = ("ffn_gate_inp (F32)", 2560, 512)
LM_HEAD = ("output (LM head)", 2560, 248320)
FORMATS = {"Q8_0": T.Q8_0, "Q4_K": T.Q4_K, "BF16": T.BF16}


def random_weight(ggml_type: T, rows: int, cols: int, rng: np.random.Generator):
    """Planes of random bytes with small finite scales: the values do not change the time."""
    form = form_for(ggml_type)
    if ggml_type == T.F32:
        return rng.standard_normal((rows, cols), dtype=np.float32)
    if form.is_float:  # f16 / bf16 bits of finite values near 1 (0x3C00..0x3E00 is finite in both)
        bits = rng.integers(0x3C00, 0x3E00, size=(rows, cols), dtype=np.uint16)
        return bits if ggml_type == T.BF16 else bits.view(np.float16)
    planes = {}
    for name, (dtype, shape) in plane_layout(form, rows, cols).items():
        if dtype.kind == "f":
            planes[name] = rng.uniform(-1e-2, 1e-2, shape).astype(dtype)
        else:
            planes[name] = rng.integers(0, 256, shape, dtype=np.uint8).view(dtype)
    return QuantTensor(form, rows, cols, **planes)


def measure(name: str, column: str, ggml_type: T, n_in: int, n_out: int, reps: int, rng) -> dict:
    """One GEMV's timing; `column` is the table's format column, `format` the type actually used."""
    if ggml_type == T.Q4_K and n_in % 256:
        ggml_type = T.Q4_0
    w = random_weight(ggml_type, n_out, n_in, rng)
    seconds = _native_check.time_gemv(w, reps)
    nbytes = w.nbytes
    return {"tensor": name, "column": column, "format": ggml_type.name, "in": n_in, "out": n_out, "bytes": nbytes,
            "us": seconds * 1e6,
            "gb_per_s": nbytes / seconds / 1e9, "pct_peak": 100.0 * nbytes / seconds / PEAK_BYTES_PER_S}


def print_table(rows: list[dict]) -> None:
    print(f"{'tensor':22} {'format':6} {'in x out':>14} {'MB':>9} {'us':>9} {'GB/s':>8} {'% 4.2TB/s':>9}")
    for r in rows:
        shape = f"{r['in']}x{r['out']}"
        print(f"{r['tensor']:22} {r['format']:6} {shape:>14} {r['bytes'] / 1e6:9.2f} {r['us']:9.2f} "
              f"{r['gb_per_s']:8.0f} {r['pct_peak']:9.1f}")


def bench_arguments(doc: str, quick: str, reps: int) -> argparse.Namespace:
    """The options of a GPU kernel benchmark: --quick (a smoke run of `quick`), --reps, --json PATH."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"{quick} (a smoke run)")
    parser.add_argument("--reps", type=int, default=reps)
    parser.add_argument("--json", type=Path)
    return parser.parse_args()


def main() -> None:
    args = bench_arguments(__doc__, "few reps, no LM head", 30)
    reps = 3 if args.quick else args.reps
    rng = np.random.default_rng(0)
    results = []
    for fmt, ggml_type in FORMATS.items():
        tensors = LAYER + ([] if args.quick else [LM_HEAD])
        results += [measure(name, fmt, ggml_type, n_in, n_out, reps, rng) for name, n_in, n_out in tensors]
    results.append(measure(ROUTER[0], "F32", T.F32, ROUTER[1], ROUTER[2], reps, rng))
    print_table(results)
    for fmt in FORMATS:
        layer = [r for r in results if r["column"] == fmt and r["tensor"] in {t[0] for t in LAYER}]
        nbytes, us = sum(r["bytes"] for r in layer), sum(r["us"] for r in layer)
        print(f"RESULT gemv layer {fmt}: {nbytes / 1e6:.1f} MB in {us:.1f} us = {nbytes / us / 1e3:.0f} GB/s "
              f"({100 * nbytes / us * 1e6 / PEAK_BYTES_PER_S:.0f}% of 4.2 TB/s)")
        for r in results:
            if r["tensor"] == LM_HEAD[0] and r["column"] == fmt:
                print(f"RESULT gemv lm_head {fmt}: {r['gb_per_s']:.0f} GB/s ({r['pct_peak']:.0f}% of 4.2 TB/s)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
