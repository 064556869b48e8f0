"""The CPU pool's row kernels alone, on one thread: ns per 32-element block of one weight row, per form and row width.

    python benchmarks/bench_pool_kernels.py [--isa avx512] [--quick] [--forms Q4_K,Q4_0] [--widths 2560,640]
                                            [--cached-only] [--repeat N] [--json PATH]

Each form runs on rows as wide as the expert shapes' (2560 and 640: qwen4exp's gate/up and down; 2048 and 512:
qwen3next's), in calls of a layer job's work item (32 rows of a gate/up matrix, 64 of a down one). "cached": the
same rows every call, so they stay in the core's L1/L2: the kernel's own cost, phase A (a row's scales) and
phase B (its blocks) together. "streamed": every call a new item of a >= 1 GiB set, walked in order: one core's
rate with the kernel's arithmetic in the way, against the pool's one-worker read test (`strata bench pool`).
"gapped": the same, but each item followed by one that is not read, so that every call starts where no prefetch
of the call before reached: a pool worker's lot when 15 share a layer job's queue and its next item is rarely
the one after its last.
A form a width cannot hold takes llama-quantize's fallback (bench pool's fitting_type), as its down would.
The pool streams ~7 GB/s a worker when 15 share the memory (docs/performance.md): a form whose cached rate is
near that is bound by its arithmetic there. On a noisy machine, --repeat N times every case N times, round-robin,
and keeps each case's best, so that a slow spell does not land on one form alone.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from gguf import GGMLQuantizationType as T

from strata import _native_check
from strata.bench.pool_experts import synthetic_experts
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


def run(isa: str = "auto", quick: bool = False, json_path: str | None = None, forms: list[T] | None = None,
        widths: list[int] | None = None, cached_only: bool = False, repeat: int = 1) -> list[dict]:
    rng = np.random.default_rng(0)
    min_seconds = 0.005 if quick else 0.05
    stream_bytes = STREAM_BYTES >> 6 if quick else STREAM_BYTES
    cases = []
    for ggml_type in forms or FORMS:
        for cols in widths or WIDTHS:
            rows = item_rows(cols)
            x = rng.standard_normal(cols).astype(np.float32)
            one = synthetic_experts(ggml_type, rows, cols, 1, rng)
            item_bytes = sum(a.nbytes for a in _planes(one))
            blocks = rows * cols // 32
            row = {"form": fitting_type(ggml_type, cols).name, "cols": cols, "rows": rows,
                   "bytes_per_block": item_bytes / blocks, "cached_ns_per_block": float("inf"),
                   "cached_gb_per_s": 0.0, "streamed_gb_per_s": None, "gapped_gb_per_s": None}
            cases.append((row, x, one, ggml_type, item_bytes, blocks))
    for _ in range(repeat):
        for row, x, one, _, item_bytes, blocks in cases:
            cached = seconds_per_call(isa, one, 1, x, row["rows"], min_seconds)
            row["cached_ns_per_block"] = min(row["cached_ns_per_block"], cached / blocks * 1e9)
            row["cached_gb_per_s"] = item_bytes / (row["cached_ns_per_block"] * blocks * 1e-9) / 1e9
    print(f"{'form':8s} {'cols':>5s} {'rows':>4s} {'B/block':>7s} {'cached ns/blk':>13s} {'cached GB/s':>11s} "
          f"{'streamed GB/s':>13s} {'gapped GB/s':>11s}")
    for row, x, _, ggml_type, item_bytes, _ in cases:
        if not cached_only:
            for key, spacing in (("streamed_gb_per_s", 1), ("gapped_gb_per_s", 2)):
                n_stream = max(2, stream_bytes // (spacing * item_bytes))
                many = synthetic_experts(ggml_type, spacing * row["rows"], row["cols"], n_stream, rng)
                row[key] = item_bytes / seconds_per_call(isa, many, n_stream, x, row["rows"], min_seconds) / 1e9
                del many
        rates = ["-" if row[key] is None else f"{row[key]:.1f}" for key in ("streamed_gb_per_s", "gapped_gb_per_s")]
        print(f"{row['form']:8s} {row['cols']:5d} {row['rows']:4d} {row['bytes_per_block']:7.1f} "
              f"{row['cached_ns_per_block']:13.2f} {row['cached_gb_per_s']:11.1f} {rates[0]:>13s} {rates[1]:>11s}",
              flush=True)
    results = [case[0] for case in cases]
    for row in results:
        streamed_text = "" if cached_only else (f", {row['streamed_gb_per_s']:.1f} GB/s streamed, "
                                                f"{row['gapped_gb_per_s']:.1f} GB/s gapped")
        print(f"RESULT pool_kernel {row['form']} cols={row['cols']}: {row['cached_ns_per_block']:.2f} ns/block cached, "
              f"{row['cached_gb_per_s']:.1f} GB/s cached{streamed_text}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"isa": isa, "time": time.time(), "repeat": repeat, "rows": results}, f, indent=1)
    return results


def _planes(q) -> list[np.ndarray]:
    """The arrays a weight's planes live in (a float array is its own plane)."""
    return matrix_spec(q, 1, "bench_pool_kernels")[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--isa", choices=("auto", "avx2", "avx512"), default="auto",
                        help="kernel ISA (default: the best the CPU has)")
    parser.add_argument("--quick", action="store_true", help="short runs over a 16 MiB set (a smoke run)")
    parser.add_argument("--forms", type=_forms, default=None, metavar="Q4_K,Q4_0",
                        help=f"forms to run (default: {','.join(t.name for t in FORMS)})")
    parser.add_argument("--widths", type=_widths, default=None, metavar="2560,640",
                        help=f"row widths to run (default: {','.join(map(str, WIDTHS))})")
    parser.add_argument("--cached-only", action="store_true", help="skip the streamed and gapped runs")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="time every case N times, round-robin, and keep each one's best (default: 1)")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the numbers as JSON")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, found {args.repeat}")
    run(args.isa, args.quick, args.json, args.forms, args.widths, args.cached_only, args.repeat)


def _forms(text: str) -> list[T]:
    """--forms: comma-separated GGML type names."""
    try:
        return [T[name.strip().upper()] for name in text.split(",")]
    except KeyError as e:
        raise argparse.ArgumentTypeError(f"unknown GGML type {e.args[0]!r}") from None


def _widths(text: str) -> list[int]:
    """--widths: comma-separated row widths, multiples of 32."""
    try:
        widths = [int(w) for w in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"widths must be integers, found {text!r}") from None
    if any(w <= 0 or w % 32 for w in widths):
        raise argparse.ArgumentTypeError(f"widths must be positive multiples of 32, found {text!r}")
    return widths


if __name__ == "__main__":
    main()
