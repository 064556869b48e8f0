"""CPU expert pool bandwidth: python benchmarks/bench_pool.py [--quick] [--isa avx2|avx512] [-k K] [--groups]
[--json PATH].

`strata bench pool` itself, run as the command, kept here so tools/gpu-check.sh finds every benchmark in one
folder."""

import subprocess
import sys

if __name__ == "__main__":
    sys.exit(subprocess.call([sys.executable, "-m", "strata.cli", "bench", "pool", *sys.argv[1:]]))
