"""CPU expert pool benchmark: effective GB/s of routed-expert bytes per layer job vs the machine's read bandwidth.

Expert sets are large enough to defeat the caches (``n_expert`` experts per layer, several layers, ids
drawn at random per job), so every job streams its k experts from DRAM; float experts (F16, BF16, F32, as
converters write them) beside the quantized forms. `hot` times each row again with the same k experts every
job, resident in the last-level cache: where that rate is near the DRAM one, the kernels, not the memory, bound
it. The read bandwidth comes from the pool's own workers reading a first-touched buffer
(cuda/src/cpu/read_bandwidth.cpp).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T

from strata.bench.pool_experts import form_name, synthetic_experts
from strata.bench.records import Emit, write_json
from strata.errors import InvalidArgument
from strata.quant.forms import fitting_type
from strata.runtime.plan import tensor_bytes
from strata.runtime.pool import ExpertPool, default_threads, physical_cores

SHAPES = {"qwen4exp": (2560, 640), "qwen3next": (2048, 512)}  # (n_embd, expert_ff)
# gate/up type, down type; a down whose rows are not whole 256-blocks takes llama-quantize's fallback type.
# F16 and BF16 are what llama.cpp's converter writes by default; F32 streams the most bytes a weight.
# Q4_K+Q6_K is llama-quantize's Q4_K_M expert mix (down one step wider).
MIXES = {"Q4_K": (T.Q4_K, T.Q4_K), "Q2_K": (T.Q2_K, T.Q2_K), "Q8_0": (T.Q8_0, T.Q8_0), "Q4_K+Q4_0": (T.Q4_K, T.Q4_0),
         "Q4_K+Q6_K": (T.Q4_K, T.Q6_K),
         "F16": (T.F16, T.F16), "BF16": (T.BF16, T.BF16), "F32": (T.F32, T.F32), "BF16+Q8_0": (T.BF16, T.Q8_0)}
# The lattice i-quants and the ternary types, one mix per distinct CPU kernel and scale plane: IQ3_XXS and IQ1_S
# run IQ2_XXS's, IQ2_S and IQ1_M IQ2_XS's (the codebook is a runtime table), TQ1_0 TQ2_0's.
IQ_MIXES = {t.name: (t, t) for t in (T.IQ2_XXS, T.IQ2_XS, T.IQ3_S, T.TQ2_0)}
HEADLINE = ("qwen4exp", "Q4_K")


@dataclass
class Scale:
    n_expert: int
    n_layers: int
    jobs: int
    read_bytes: int
    set_bytes: int  # the most expert bytes per configuration: float experts get fewer experts, never fewer than k


BOX = Scale(n_expert=128, n_layers=4, jobs=60, read_bytes=2 << 30, set_bytes=6 << 30)
QUICK = Scale(n_expert=16, n_layers=2, jobs=10, read_bytes=128 << 20, set_bytes=256 << 20)


def time_jobs(pool: ExpertPool, n_layers: int, n_expert: int, k: int, jobs: int, rng: np.random.Generator,
              hot: bool = False) -> np.ndarray:
    """Seconds per run_layer_sum call (the decode loop's job), ids drawn at random per job (two warm-up jobs not
    counted). `hot`: the same k experts of layer 0 every job, which stay in the last-level cache: the kernels' own
    ceiling, not the memory's."""
    x = rng.standard_normal(pool.n_embd, dtype=np.float32)
    weights = np.full(k, 1.0 / k, np.float32)
    skip = np.zeros(k, np.uint8)
    out = np.empty(pool.n_embd, np.float32)
    if hot:
        plans = [(0, np.arange(k, dtype=np.int32))] * (jobs + 2)
    else:
        plans = [(int(rng.integers(n_layers)), rng.choice(n_expert, k, replace=False).astype(np.int32))
                 for _ in range(jobs + 2)]
    times = []
    for layer, ids in plans:
        t0 = time.perf_counter()
        pool.run_layer_sum(layer, x, ids, weights, skip, out)
        times.append(time.perf_counter() - t0)
    return np.array(times[2:])


def experts_per_layer(scale: Scale, types: tuple[T, T], n_embd: int, ff: int, k: int) -> int:
    """scale.n_expert, fewer where the set would pass scale.set_bytes (float experts are 2-4 bytes a weight)."""
    gate_type, down_type = types
    per_expert = (tensor_bytes(fitting_type(gate_type, n_embd), (n_embd, 2 * ff))
                  + tensor_bytes(fitting_type(down_type, ff), (ff, n_embd)))
    return max(k, min(scale.n_expert, scale.set_bytes // (per_expert * scale.n_layers)))


def thread_sweep(max_threads: int) -> list[int]:
    return sorted({n for n in (1, 2, 4, 8, 12, max_threads) if n <= max_threads})


def run(emit: Emit, quick: bool = False, k: int = 10, isa: str | None = None, json_path: str | None = None,
        mixes: list[str] | None = None, hot: bool = False) -> dict:
    """Runs the benchmark, emits a table and RESULT lines, returns (and optionally writes) the numbers.
    `mixes` (names of MIXES or IQ_MIXES) limits the rows to those mixes; the headline row always runs. `hot` also
    times each row with its k experts cache-resident (time_jobs), the "hot GB/s" column."""
    unknown = sorted(set(mixes or ()) - set(MIXES) - set(IQ_MIXES))
    if unknown:
        raise InvalidArgument(f"bench pool: unknown mix {', '.join(unknown)}; "
                              f"known: {', '.join([*MIXES, *IQ_MIXES])}")
    scale = QUICK if quick else BOX
    rng = np.random.default_rng()
    n_all = default_threads()
    cores = physical_cores()
    smt_possible = any(len(cpus) > 1 for cpus, _ in cores[1:])
    result: dict = {"physical_cores": len(cores), "workers_all": n_all, "k": k, "n_expert": scale.n_expert,
                    "n_layers": scale.n_layers, "set_bytes": scale.set_bytes, "read_bw": {}, "layers": []}

    emit(f"{len(cores)} physical cores, workers 1..{n_all}; read bandwidth ({scale.read_bytes >> 20} MiB):")
    for n in thread_sweep(n_all):
        with ExpertPool(64, 64, 1, threads=n, isa=isa) as pool:
            result["read_bw"][n] = pool.read_bandwidth(scale.read_bytes) / 1e9
            caller = " + the caller" if pool.participants > pool.threads else ""
        emit(f"  {n:3d} workers{caller}: {result['read_bw'][n]:7.1f} GB/s")
    if smt_possible:
        with ExpertPool(64, 64, 1, smt=True, isa=isa) as pool:
            result["read_bw_smt"] = pool.read_bandwidth(scale.read_bytes) / 1e9
            result["smt_workers"] = pool.threads
        emit(f"  {result['smt_workers']:3d} workers (SMT siblings too): {result['read_bw_smt']:7.1f} GB/s")
    bw_all = result["read_bw"][n_all]

    emit("\n(thr: the threads a job runs on, the workers and the caller where it takes part)")
    emit(f"{'shape':10s} {'mix':10s} {'down':7s} {'thr':>4s} {'MB/job':>7s} {'med us':>8s} {'p90 us':>8s} "
          f"{'GB/s':>6s} {'%bw':>5s} {'lat/bound':>9s}" + (f" {'hot GB/s':>8s}" if hot else ""))
    for shape, (n_embd, ff) in SHAPES.items():
        for mix, (gate_type, down_type) in {**MIXES, **IQ_MIXES}.items():
            if mixes and mix not in mixes and (shape, mix) != HEADLINE:
                continue
            n_expert = experts_per_layer(scale, (gate_type, down_type), n_embd, ff, k)
            gate = [synthetic_experts(gate_type, ff, n_embd, n_expert, rng) for _ in range(2 * scale.n_layers)]
            down = [synthetic_experts(down_type, n_embd, ff, n_expert, rng) for _ in range(scale.n_layers)]
            sweep = thread_sweep(n_all) if (shape, mix) == HEADLINE else [n_all]
            variants = [(n, False) for n in sweep]
            if (shape, mix) == HEADLINE and smt_possible:
                variants.append((0, True))
            for n, smt in variants:
                with ExpertPool(n_embd, ff, k, threads=n or None, smt=smt, isa=isa) as pool:
                    for layer in range(scale.n_layers):
                        pool.set_layer(layer, gate[2 * layer], gate[2 * layer + 1], down[layer], n_expert)
                    job_bytes = pool.layer_bytes(0) * k
                    times = time_jobs(pool, scale.n_layers, n_expert, k, scale.jobs, rng)
                    row = {"shape": shape, "mix": mix, "down_form": form_name(down[0]), "n_expert": n_expert,
                           "threads": pool.threads, "participants": pool.participants,
                           "smt": smt, "isa": pool.isa, "job_bytes": job_bytes,
                           "median_s": float(np.median(times)), "p90_s": float(np.percentile(times, 90))}
                    if hot:
                        hot_s = float(np.median(time_jobs(pool, scale.n_layers, n_expert, k, scale.jobs, rng, True)))
                        row["hot_gb_per_s"] = job_bytes / hot_s / 1e9
                row["gb_per_s"] = job_bytes / row["median_s"] / 1e9
                row["fraction_of_read_bw"] = row["gb_per_s"] / bw_all
                row["latency_over_bound"] = row["median_s"] / (job_bytes / (bw_all * 1e9))
                result["layers"].append(row)
                emit(f"{shape:10s} {mix:10s} {row['down_form']:7s} {row['participants']:4d}{'s' if smt else ' '}"
                      f"{job_bytes / 1e6:7.1f} {row['median_s'] * 1e6:8.0f} {row['p90_s'] * 1e6:8.0f} "
                      f"{row['gb_per_s']:6.1f} {100 * row['fraction_of_read_bw']:5.1f} {row['latency_over_bound']:9.2f}"
                      + (f" {row['hot_gb_per_s']:8.1f}" if hot else ""))
            del gate, down

    head = next(r for r in result["layers"]
                if (r["shape"], r["mix"]) == HEADLINE and r["threads"] == n_all and not r["smt"])
    emit(f"RESULT read_bw_all_workers_gbps={bw_all:.1f} read_bw_1_worker_gbps={result['read_bw'][1]:.1f}")
    emit(f"RESULT pool_qwen4exp_q4k_k{k}_gbps={head['gb_per_s']:.1f} fraction_of_read_bw="
          f"{head['fraction_of_read_bw']:.3f} latency_over_bound={head['latency_over_bound']:.2f} "
          f"median_us={head['median_s'] * 1e6:.0f} p90_us={head['p90_s'] * 1e6:.0f}")
    if json_path:
        write_json(json_path, result)
    return result
