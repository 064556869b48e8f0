"""The disk tier on a model file against the limit its reads set (docs/tiers.md, "On the GPU box").

    python3 benchmarks/bench_tiers.py [MODEL.gguf] [--shares 33,100 | --ram-budget 16G] [--cache 0 | SIZE]
        [--tokens 64] [--prompt-tokens 16] [--pool-only] [--json PATH]

Without MODEL, `strata bench`'s default benchmark model (synthesized once into the cache; keep the cache on a
local disk, not /dev/shm, for the figures to be the disk's).
First the file's read rate, measured with the tier's own kind of reads: O_DIRECT, 8 in flight, each one matrix
of an expert at a random place among the routed experts; again after each share's decode, whose limit takes the
higher of the rates before and after it (a disk whose rate drifts, a cloud volume's burst or a write-back still
under way, never flatters the fraction). Then, for each share of the routed experts in RAM (or
the one --ram-budget), the model is loaded with a VRAM cache of --cache (default 0: off; a tiered load's cache is
static, each layer's highest ids) and decodes greedily in the token graph (with
--pool-only: the CPU pool alone runs every MoE layer of each token, routing uniform as the synthetic models').
Per share, RESULT lines: tok/s; the tier's misses and bytes read per decoded token (the prompt's chunk left
out: it reads its rows' whole union); the limit, which adds the routed bytes in RAM at the host read rate, the
missed bytes at the disk rate and, on the GPU, the dense and cached bytes at the HBM rate and the doorbells; its
fraction; VmRSS and VmLck against the budget.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import strata
from strata.bench.decode import run_modes
from strata.bench.default_model import bench_model, cache_dir
from strata.bench.limit import machine_limit
from strata.bench.rates import READ_BANDWIDTH_BYTES, measure
from strata.bench.tiers import DiskRate, disk_rate, expert_spans, tier_counts, tiered_limit
from strata.format import inspect
from strata.options import KV, Mode
from strata.progress import ByteProgress
from strata.runtime.expert_cache import parse_budget
from strata.runtime.loader import load_experts
from strata.runtime.plan import file_tensors
from strata.runtime.pool import ExpertPool
from strata.synth import synthesize
from strata.runtime.tiers import IO_THREADS, RamBudget, plan_ram, ram_budget, share_budget


def status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def faster(a: DiskRate, b: DiskRate) -> DiskRate:
    return a if a.bytes_per_second >= b.bytes_per_second else b


def figures(budget: RamBudget, seconds: float, limit_seconds: float, misses: float, disk_bytes: float,
            host_read: float, tiered: bool, disk: DiskRate, disk_before: DiskRate, disk_after: DiskRate) -> dict:
    """One decode's figures: `seconds` and `limit_seconds` a token, its misses and bytes read from the file a token,
    the limit's disk rate (`disk`) and the rates around the decode, the process's memory now."""
    return {"tokens_per_second": 1 / seconds, "limit_tokens_per_second": 1 / limit_seconds,
            "fraction_of_limit": limit_seconds / seconds, "misses_per_token": misses,
            "disk_bytes_per_token": disk_bytes, "host_read": host_read, "tiered": tiered, "budget": budget.nbytes,
            "vm_rss": status_bytes("VmRSS"), "vm_lck": status_bytes("VmLck"), "disk_rate": disk.bytes_per_second,
            "disk_rate_before": disk_before.bytes_per_second, "disk_rate_after": disk_after.bytes_per_second}


def gpu_share(path: str, budget: RamBudget, disk_before: DiskRate, measure_disk, args) -> list[dict]:
    """--repeat decodes of one load, each with the disk's rate measured after it (the next one's rate before)."""
    with strata.load(path, ram_budget=budget.nbytes, expert_cache=args.cache) as model:
        g, tensors = model.info.geometry, file_tensors(model.file)
        rates = measure(model.pool, model.device)
        base = machine_limit(g, tensors, rates, model.cache_slots)
        runs = []
        for _ in range(args.repeat):
            decoded = run_modes(model, [Mode.TOKEN_GRAPH], args.prompt_tokens, args.tokens, None, KV.INT8,
                                np.random.default_rng(), probe=lambda: tier_counts(model.pool))[Mode.TOKEN_GRAPH.value]
            before, after = decoded["probe"]  # the timed tokens only: the prompt's chunk reads its rows' whole union
            disk_after = measure_disk()
            disk = faster(disk_before, disk_after)
            limit = tiered_limit(base, before, after, args.tokens, disk)
            runs.append({**figures(budget, decoded["seconds_per_token"], limit["seconds"], limit["misses_per_token"],
                                   limit["disk_bytes_per_token"], rates.host_read, model.ram.tiered, disk,
                                   disk_before, disk_after),
                         "cached_bytes_per_token": base.cached_bytes})
            disk_before = disk_after
        return runs


def pool_share(path: str, budget: RamBudget, disk_before: DiskRate, measure_disk, args) -> list[dict]:
    """gpu_share's runs on the CPU pool alone: every MoE layer of each token, routing uniform."""
    with inspect(path) as file:
        g = file.geometry
        plan = plan_ram(file, budget)
        with ExpertPool(g.n_embd, g.expert_ff, g.n_expert_used) as pool:
            load_experts(file, pool, None, plan)
            host_read = pool.read_bandwidth(READ_BANDWIDTH_BYTES)
            rng = np.random.default_rng()
            layers = [layer for layer in range(g.n_layer) if pool.n_expert(layer)]
            out = np.empty(g.n_embd, np.float32)
            weights = np.full(g.n_expert_used, 1 / g.n_expert_used, np.float32)
            runs = []
            for _ in range(args.repeat):
                before = tier_counts(pool) if plan.tiered else (0, 0, 0)
                start = time.perf_counter()
                for _ in range(args.tokens):
                    for layer in layers:
                        x = rng.standard_normal(g.n_embd, dtype=np.float32)
                        ids = rng.choice(g.n_expert, g.n_expert_used, replace=False).astype(np.int32)
                        pool.run_layer_sum(layer, x, ids, weights, out=out)
                seconds = (time.perf_counter() - start) / args.tokens
                disk_after = measure_disk()
                disk = faster(disk_before, disk_after)
                hits, misses, read = ((a - b for a, b in zip(tier_counts(pool), before)) if plan.tiered
                                      else (args.tokens * len(layers) * g.n_expert_used, 0, 0))
                in_ram = sum(pool.layer_bytes(layer) for layer in layers) * g.n_expert_used * hits
                in_ram /= max(hits + misses, 1) * len(layers)
                limit = in_ram / host_read + read / args.tokens / disk.bytes_per_second
                runs.append(figures(budget, seconds, limit, misses / args.tokens, read / args.tokens, host_read,
                                    plan.tiered, disk, disk_before, disk_after))
                disk_before = disk_after
            return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--shares", default="33", help="percentages of the routed experts in RAM, e.g. 33,100")
    parser.add_argument("--ram-budget", default=None, help="one budget instead of --shares (e.g. 16G)")
    parser.add_argument("--cache", default="0", help="the VRAM expert cache: 0 (off), a size such as 12G, or auto")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--pool-only", action="store_true", help="the CPU pool alone: no GPU")
    parser.add_argument("--disk-seconds", type=float, default=4.0, help="how long the read rate is measured")
    parser.add_argument("--repeat", type=int, default=1,
                        help="decodes of each load, the disk's rate measured between them")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.model is None:
        args.model = str(bench_model(cache_dir(), synthesize, ByteProgress("bench: synth")))
    with inspect(args.model) as file:
        spans = expert_spans(file)
        disk = disk_rate(str(file.path), spans, args.disk_seconds)
        if args.ram_budget is not None:
            budgets = [ram_budget(parse_budget(args.ram_budget, "--ram-budget"))]
        else:
            budgets = [share_budget(file, int(p) / 100) for p in args.shares.split(",")]
    print(f"RESULT disk_read_rate {disk.bytes_per_second / 1e9:.3f} GB/s ({disk.reads}, {IO_THREADS} in flight, "
          "expert matrices)")
    run = pool_share if args.pool_only else gpu_share
    results = {"model": args.model, "disk_read_rate": disk.bytes_per_second, "disk_reads": disk.reads, "shares": {}}
    for budget in budgets:
        runs = run(args.model, budget, disk, lambda: disk_rate(args.model, spans, args.disk_seconds), args)
        disk = DiskRate(runs[-1]["disk_rate_after"], disk.reads)  # the next share's rate before
        for i, r in enumerate(runs):
            name = budget.source + (f", run {i + 1} of {len(runs)}" if len(runs) > 1 else "")
            results["shares"][name] = r
            print(f"RESULT {name}: {r['tokens_per_second']:.2f} tok/s, limit {r['limit_tokens_per_second']:.2f} "
                  f"({r['fraction_of_limit']:.1%}); misses {r['misses_per_token']:.1f}/token, "
                  f"{r['disk_bytes_per_token'] / 1e6:.1f} MB/token from disk at {r['disk_rate'] / 1e9:.3f} GB/s "
                  f"(before {r['disk_rate_before'] / 1e9:.3f}, after {r['disk_rate_after'] / 1e9:.3f}); budget "
                  f"{budget.nbytes / 2**30:.2f} GiB, VmRSS {r['vm_rss'] / 2**30:.2f} GiB, "
                  f"VmLck {r['vm_lck'] / 2**30:.2f} GiB")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
