"""`strata bench pool`: the CPU expert pool benchmark (strata.bench.pool; with --groups, strata.bench.pool_groups;
with --jobs, strata.bench.pool_jobs), parsed apart from `strata bench [MODEL]`."""

from __future__ import annotations

import argparse

from strata.bench import pool as pool_bench
from strata.bench import pool_groups, pool_jobs
from strata.cli.help import ShowDefaults


def build_parser() -> argparse.ArgumentParser:
    """`strata bench pool`: parsed apart from `strata bench [MODEL]` (see strata.cli.parse_args)."""
    pool = argparse.ArgumentParser(
        prog="strata bench pool", description="CPU expert pool: GB/s per layer job vs the machine's read bandwidth",
        formatter_class=ShowDefaults)
    pool.add_argument("--quick", action="store_true", help="small expert sets (a smoke run)")
    pool.add_argument("--isa", choices=("avx2", "avx512"), default=None, help="force a kernel ISA")
    pool.add_argument("-k", type=int, default=10, help="routed experts per layer job (default 10)")
    pool.add_argument("--json", metavar="PATH", default=None, help="also write the numbers as JSON")
    pool.add_argument("--mix", action="append", default=None, metavar="MIX",
                      help=f"only this expert mix (repeatable; the headline row always runs): "
                           f"{', '.join([*pool_bench.MIXES, *pool_bench.IQ_MIXES])}")
    pool.add_argument("--hot", action="store_true",
                      help="also time each row with the same k experts every job (cache-resident): the kernels' "
                           "own ceiling beside the memory's")
    pool.add_argument("--groups", action="store_true",
                      help="time run_groups instead: a prompt chunk's rows grouped by expert "
                           "(strata.bench.pool_groups)")
    pool.add_argument("--jobs", action="store_true",
                      help="time the layer job organised four ways instead: its rows, the rows summed by numpy, "
                           "run_layer_sum with the caller taking part and waiting (strata.bench.pool_jobs)")
    pool.set_defaults(handler=handle, command="bench pool")
    return pool


def handle(args: argparse.Namespace) -> int:
    if args.groups:
        pool_groups.run(print, quick=args.quick, isa=args.isa, json_path=args.json)
    elif args.jobs:
        pool_jobs.run(print, quick=args.quick, k=args.k, isa=args.isa, json_path=args.json)
    else:
        pool_bench.run(print, quick=args.quick, k=args.k, isa=args.isa, json_path=args.json, mixes=args.mix,
                       hot=args.hot)
    return 0
