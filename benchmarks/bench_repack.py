"""Repack throughput: GB/s of GGUF bytes in, per type and thread count.

    python benchmarks/bench_repack.py --size-gib 1 --threads 1,4,16 --types Q4_K,Q4_0,Q8_0,Q2_K [--json]

Synthesizes random well-formed blocks (strata.quant.synthetic) once per type, then times repack,
keeping the best of --repeat runs (the first run also pays for page faults of the output planes).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from strata.quant import repack
from strata.quant.synthetic import random_blocks

COLS = 4096  # a typical hidden size; rows follow from the requested size


def measure(ggml_type: T, size_bytes: int, threads: list[int], repeat: int, rng: np.random.Generator) -> list[dict]:
    block_size, type_size = GGML_QUANT_SIZES[ggml_type]
    row_bytes = COLS // block_size * type_size
    rows = max(1, size_bytes // row_bytes)
    raw = random_blocks(ggml_type, rows * COLS, rng)
    results = []
    for n in threads:
        best = min(_time(lambda: repack(raw, ggml_type, (COLS, rows), threads=n)) for _ in range(repeat))
        results.append({"type": ggml_type.name, "threads": n, "bytes": raw.nbytes, "seconds": best,
                        "gb_per_s": raw.nbytes / best / 1e9})
    return results


def _time(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gib", type=float, default=1.0, help="GGUF bytes per type (default 1 GiB)")
    parser.add_argument("--types", default="Q4_K,Q4_0,Q8_0,Q2_K,Q3_K,Q5_K,Q6_K,IQ4_XS,MXFP4")
    parser.add_argument("--threads", default=None, help="comma list (default: 1 and every power of 2 up to all cores)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    threads = ([int(t) for t in args.threads.split(",")] if args.threads
               else sorted({1, cores, *(2**k for k in range(1, 8) if 2**k < cores)}))
    rng = np.random.default_rng()
    size = int(args.size_gib * 2**30)
    results = [r for name in args.types.split(",") for r in measure(T[name.strip()], size, threads, args.repeat, rng)]
    if args.json:
        Path(args.json).write_text(json.dumps({"cores": cores, "results": results}, indent=1))
    print(f"repack throughput, {args.size_gib:g} GiB of GGUF bytes per type, {cores} cores available")
    print(f"{'type':<8}" + "".join(f"{f'{n} thr':>10}" for n in threads) + "   (GB/s in)")
    for name in args.types.split(","):
        row = [r for r in results if r["type"] == name.strip()]
        print(f"{name.strip():<8}" + "".join(f"{r['gb_per_s']:>10.2f}" for r in row))
    for name in args.types.split(","):
        best = max((r for r in results if r["type"] == name.strip()), key=lambda r: r["gb_per_s"])
        print(f"RESULT repack {name.strip()}: {best['gb_per_s']:.2f} GB/s with {best['threads']} threads")


if __name__ == "__main__":
    main()
