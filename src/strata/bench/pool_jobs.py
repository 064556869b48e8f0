"""The CPU expert pool's layer job, organised four ways on one set of experts, so that what the job's barrier, the
sum of its k rows and its caller cost is measured apart (docs/performance-history.md, the second day of decode at
the limit): run_layer's rows, the same beside numpy summing them afterwards, and run_layer_sum (the decode loop's
job) with the calling thread taking part and with it only waiting (a thread whose CPUs span the workers').

The benchmark model's experts (gate/up Q4_K, down Q4_0, 2560 x 640), ids drawn per job over several layers so
that the job streams from DRAM, as bench pool's rows do.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from strata.bench.pool_experts import DOWN, FF, GATE_UP, N_EMBD, synthetic_experts
from strata.bench.records import Emit, write_json
from strata.runtime.pool import ExpertPool


@dataclass
class JobScale:
    n_expert: int
    n_layers: int
    jobs: int
    read_bytes: int


BOX = JobScale(n_expert=128, n_layers=4, jobs=80, read_bytes=2 << 30)
QUICK = JobScale(n_expert=16, n_layers=2, jobs=6, read_bytes=128 << 20)
WARM_UP = 4  # jobs not counted
LABELS = {"rows": "run_layer's rows", "rows_numpy_sum": "the rows, then numpy sums them",
          "sum_caller_joins": "run_layer_sum, the caller taking part",
          "sum_caller_waits": "run_layer_sum, the caller waiting"}


def run(emit: Emit, quick: bool = False, k: int = 10, isa: str | None = None, json_path: str | None = None) -> dict:
    """Median seconds a job of each organisation; emits a table and a RESULT line, returns the numbers."""
    scale = QUICK if quick else BOX
    rng = np.random.default_rng()
    layers = [(synthetic_experts(GATE_UP, FF, N_EMBD, scale.n_expert, rng),
               synthetic_experts(GATE_UP, FF, N_EMBD, scale.n_expert, rng),
               synthetic_experts(DOWN, N_EMBD, FF, scale.n_expert, rng)) for _ in range(scale.n_layers)]
    plans = [(int(rng.integers(scale.n_layers)), rng.choice(scale.n_expert, k, replace=False).astype(np.int32))
             for _ in range(scale.jobs + WARM_UP)]
    x = rng.standard_normal(N_EMBD, dtype=np.float32)
    weights = np.full(k, 1.0 / k, np.float32)
    skip = np.zeros(k, np.uint8)
    rows, summed = np.empty((k, N_EMBD), np.float32), np.empty(N_EMBD, np.float32)
    with ExpertPool(N_EMBD, FF, k, isa=isa) as pool:
        for layer, (gate, up, down) in enumerate(layers):
            pool.set_layer(layer, gate, up, down, n_expert=scale.n_expert)
        job_bytes = pool.layer_bytes(0) * k
        read_bw = pool.read_bandwidth(scale.read_bytes)

        def median(job: Callable[[int, np.ndarray], object]) -> float:
            times = []
            for layer, ids in plans:
                t0 = time.perf_counter()
                job(layer, ids)
                times.append(time.perf_counter() - t0)
            return float(np.median(times[WARM_UP:]))

        def from_a_thread_on_the_workers_cpus() -> float:
            got: list[float] = []

            def body() -> None:
                os.sched_setaffinity(0, os.sched_getaffinity(0) | {c for cpus in pool.worker_cpus for c in cpus})
                got.append(median(lambda layer, ids: pool.run_layer_sum(layer, x, ids, weights, skip, summed)))

            thread = threading.Thread(target=body)
            thread.start()
            thread.join()
            return got[0]

        variants = {
            "rows": median(lambda layer, ids: pool.run_layer(layer, x, ids, weights, skip, rows)),
            "rows_numpy_sum": median(
                lambda layer, ids: (pool.run_layer(layer, x, ids, weights, skip, rows), rows.sum(axis=0))),
            "sum_caller_joins": median(lambda layer, ids: pool.run_layer_sum(layer, x, ids, weights, skip, summed)),
            "sum_caller_waits": from_a_thread_on_the_workers_cpus(),
        }
        result = {"n_embd": N_EMBD, "expert_ff": FF, "gate_up": GATE_UP.name, "down": DOWN.name, "k": k,
                  "n_expert": scale.n_expert, "n_layers": scale.n_layers, "threads": pool.threads,
                  "participants": pool.participants, "isa": pool.isa, "job_bytes": job_bytes,
                  "read_bw_gbps": read_bw / 1e9,
                  "jobs": {name: {"median_s": s, "gb_per_s": job_bytes / s / 1e9,
                                  "fraction_of_read_bw": job_bytes / s / read_bw} for name, s in variants.items()}}
    emit(f"layer jobs of {job_bytes / 1e6:.1f} MB (k = {k}, {GATE_UP.name} gate/up, {DOWN.name} down, "
         f"{N_EMBD} x {FF}), {result['threads']} workers"
         f"{' and the caller' if result['participants'] > result['threads'] else ''} ({result['isa']}), read test "
         f"{read_bw / 1e9:.1f} GB/s:")
    for name, job in result["jobs"].items():
        emit(f"  {LABELS[name]:40s} {job['median_s'] * 1e6:8.1f} us {job['gb_per_s']:6.1f} GB/s "
             f"{100 * job['fraction_of_read_bw']:5.1f} % of the read test")
    emit("RESULT pool_jobs " + " ".join(f"{name}_us={job['median_s'] * 1e6:.1f}"
                                        for name, job in result["jobs"].items()))
    if json_path:
        write_json(json_path, result)
    return result
