"""The CPU pool's row kernels alone, on one thread: ns per 32-element block of one weight row, per form and row width.

    python benchmarks/bench_pool_kernels.py [--isa avx512] [--quick] [--json PATH]

Each form runs on rows as wide as the expert shapes' (2560 and 640: qwen4exp's gate/up and down; 2048 and 512:
qwen3next's), in calls of a layer job's work item (32 rows of a gate/up matrix, 64 of a down one). "cached": the
same rows every call, so they stay in the core's L1/L2: the kernel's own cost, phase A (a row's scales) and
phase B (its blocks) together. "streamed": every call a new item of a >= 1 GiB set, walked in order: one core's
rate with the kernel's arithmetic in the way, against the pool's one-worker read test (`strata bench pool`).
A form a width cannot hold takes llama-quantize's fallback (bench pool's fitting_type), as its down would.
The pool streams ~7 GB/s a worker when 15 share the memory (docs/performance.md): a form whose cached rate is
near that is bound by its arithmetic there.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from gguf import GGMLQuantizationType as T

from strata import _native_check
from strata.cli.bench_pool import synthetic_experts
from strata.quant.forms import fitting_type
from strata.runtime.pool import matrix_spec

FORMS = [T.Q4_K, T.Q4_0, T.Q5_0, T.Q8_0, T.Q6_K, T.Q2_K, T.IQ4_NL, T.BF16]
WIDTHS = [2560, 640, 2048, 512]
STREAM_BYTES = 1 << 30


def item_rows(cols: int) -> int:
    """Rows of a layer job's work item on rows this wide (expert_pool.cpp: 32 of gate/up, 64 of down)."""
    return 32 if cols >= 2048 else 64


def seconds_per_call(isa: str, q, n_expert: int, x: np.ndarray, rows: int, min_seconds: float) -> float:
    """Per call, over enough calls to last min_seconds (best of three such runs)."""
    calls = 1
    while _native_check.time_expert_rows(isa, q, n_expert, x, rows, calls) < min_seconds / 4:
        calls *= 4
    return min(_native_check.time_expert_rows(isa, q, n_expert, x, rows, calls) / calls for _ in range(3))


def run(isa: str = "auto", quick: bool = False, json_path: str | None = None) -> list[dict]:
    rng = np.random.default_rng(0)
    min_seconds = 0.005 if quick else 0.05
    stream_bytes = STREAM_BYTES >> 6 if quick else STREAM_BYTES
    results = []
    print(f"{'form':8s} {'cols':>5s} {'rows':>4s} {'B/block':>7s} {'cached ns/blk':>13s} {'cached GB/s':>11s} "
          f"{'streamed GB/s':>13s}")
    for ggml_type in FORMS:
        for cols in WIDTHS:
            rows = item_rows(cols)
            x = rng.standard_normal(cols).astype(np.float32)
            one = synthetic_experts(ggml_type, rows, cols, 1, rng)
            item_bytes = sum(a.nbytes for a in _planes(one))
            n_stream = max(2, stream_bytes // item_bytes)
            many = synthetic_experts(ggml_type, rows, cols, n_stream, rng)
            blocks = rows * cols // 32
            cached = seconds_per_call(isa, one, 1, x, rows, min_seconds)
            streamed = seconds_per_call(isa, many, n_stream, x, rows, min_seconds)
            row = {"form": fitting_type(ggml_type, cols).name, "cols": cols, "rows": rows,
                   "bytes_per_block": item_bytes / blocks, "cached_ns_per_block": cached / blocks * 1e9,
                   "cached_gb_per_s": item_bytes / cached / 1e9, "streamed_gb_per_s": item_bytes / streamed / 1e9}
            results.append(row)
            print(f"{row['form']:8s} {cols:5d} {rows:4d} {row['bytes_per_block']:7.1f} "
                  f"{row['cached_ns_per_block']:13.2f} {row['cached_gb_per_s']:11.1f} {row['streamed_gb_per_s']:13.1f}",
                  flush=True)
            del many
    for row in results:
        print(f"RESULT pool_kernel {row['form']} cols={row['cols']}: {row['cached_ns_per_block']:.2f} ns/block cached, "
              f"{row['cached_gb_per_s']:.1f} GB/s cached, {row['streamed_gb_per_s']:.1f} GB/s streamed")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"isa": isa, "time": time.time(), "rows": results}, f, indent=1)
    return results


def _planes(q) -> list[np.ndarray]:
    """The arrays a weight's planes live in (a float array is its own plane)."""
    return matrix_spec(q, 1, "bench_pool_kernels")[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--isa", choices=("auto", "avx2", "avx512"), default="auto",
                        help="kernel ISA (default: the best the CPU has)")
    parser.add_argument("--quick", action="store_true", help="short runs over a 16 MiB set (a smoke run)")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the numbers as JSON")
    args = parser.parse_args()
    run(args.isa, args.quick, args.json)


if __name__ == "__main__":
    main()
