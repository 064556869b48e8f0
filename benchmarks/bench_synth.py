"""Measure how fast strata.synth writes a synthetic model (GB/s of file written).

    PYTHONPATH=src python benchmarks/bench_synth.py --arch qwen4exp --preset bench --out /some/dir
Prints a RESULT line (GB/s, bytes, seconds, threads); --json PATH also writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from strata.synth import synthesize
from strata.synth.presets import geometry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="qwen4exp")
    ap.add_argument("--preset", default="bench")
    ap.add_argument("--n-layer", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="directory for the file (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the file instead of deleting it")
    ap.add_argument("--json", metavar="PATH", help="also write the result as JSON to PATH")
    args = ap.parse_args()
    out_dir = Path(args.out or tempfile.mkdtemp(prefix="strata-synth-"))
    path = out_dir / f"synth-{args.arch}-{args.preset}.gguf"
    g = geometry(args.arch, args.preset, args.n_layer)
    start = time.perf_counter()
    synthesize(path, args.arch, args.preset, n_layer=args.n_layer, seed=args.seed, threads=args.threads)
    os.sync()  # count the bytes as written only once the page cache has handed them to the disk
    seconds = time.perf_counter() - start
    size = path.stat().st_size
    result = {"arch": args.arch, "preset": args.preset, "n_layer": g.n_layer, "bytes": size,
              "seconds": round(seconds, 3), "GB_per_s": round(size / seconds / 1e9, 3),
              "threads": args.threads or os.cpu_count()}
    if args.json:
        Path(args.json).write_text(json.dumps(result))
    print(f"RESULT synth {args.arch} {args.preset} ({g.n_layer} layers): {result['GB_per_s']} GB/s, "
          f"{size / 1e9:.1f} GB in {result['seconds']} s, {result['threads']} threads")
    if not args.keep:
        path.unlink()


if __name__ == "__main__":
    main()
