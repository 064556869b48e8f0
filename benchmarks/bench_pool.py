"""CPU expert pool bandwidth: python benchmarks/bench_pool.py [--quick] [--isa avx2|avx512] [--json PATH].

The same as `strata bench pool`; kept here so tools/gpu-check.sh finds every benchmark in one folder."""

from __future__ import annotations

import argparse

from strata.bench_pool import run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small expert sets, for a local smoke run")
    parser.add_argument("--isa", choices=("avx2", "avx512"), default=None, help="force a kernel ISA")
    parser.add_argument("-k", type=int, default=10, help="routed experts per job")
    parser.add_argument("--json", default=None, help="write the numbers here")
    args = parser.parse_args()
    run(quick=args.quick, k=args.k, isa=args.isa, json_path=args.json)


if __name__ == "__main__":
    main()
