"""CPU expert pool bandwidth: python benchmarks/bench_pool.py [--quick] [--isa avx2|avx512] [-k K] [--groups]
[--json PATH].

`strata bench pool` itself, kept here so tools/gpu-check.sh finds every benchmark in one folder."""

import sys

from strata.cli import bench_pool

if __name__ == "__main__":
    sys.exit(bench_pool.handle(bench_pool.build_parser().parse_args()))
