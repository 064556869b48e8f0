"""The CPU expert pool's grouped route (run_groups) on a prompt chunk's routed rows.

Every expert of a layer gets the same number of rows (the benchmark model: 512 experts x 80 rows, gate/up
Q4_K, down Q4_0, 2560 x 640), so each call streams the whole layer's expert weights once. Reported: GB/s of
those weights and rows/s, beside the pool's own read bandwidth (the bound the weights stream against).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from strata.bench.pool_experts import DOWN, FF, GATE_UP, N_EMBD, synthetic_experts
from strata.bench.records import Emit, write_json
from strata.runtime.pool import ExpertPool, default_threads


@dataclass
class GroupScale:
    n_expert: int
    rows_per_expert: int
    calls: int
    read_bytes: int


BOX = GroupScale(n_expert=512, rows_per_expert=80, calls=5, read_bytes=2 << 30)
QUICK = GroupScale(n_expert=8, rows_per_expert=80, calls=2, read_bytes=128 << 20)


def run(emit: Emit, quick: bool = False, isa: str | None = None, json_path: str | None = None) -> dict:
    """Times run_groups over one layer of every expert; emits a table and RESULT lines, returns the numbers."""
    scale = QUICK if quick else BOX
    rng = np.random.default_rng()
    rows = scale.n_expert * scale.rows_per_expert
    gate = synthetic_experts(GATE_UP, FF, N_EMBD, scale.n_expert, rng)
    up = synthetic_experts(GATE_UP, FF, N_EMBD, scale.n_expert, rng)
    down = synthetic_experts(DOWN, N_EMBD, FF, scale.n_expert, rng)
    x = rng.standard_normal((rows, N_EMBD), dtype=np.float32)
    experts = rng.permutation(scale.n_expert).astype(np.int32)
    begin = np.arange(scale.n_expert + 1, dtype=np.int32) * scale.rows_per_expert
    out = np.empty((rows, N_EMBD), np.float32)
    with ExpertPool(N_EMBD, FF, 1, isa=isa, max_rows=rows) as pool:
        pool.set_layer(0, gate, up, down, n_expert=scale.n_expert)
        read_bw = pool.read_bandwidth(scale.read_bytes) / 1e9
        weight_bytes = pool.layer_bytes(0) * scale.n_expert
        times = []
        for _ in range(scale.calls + 1):  # the first call (page faults in out and the scratch) is not counted
            t0 = time.perf_counter()
            pool.run_groups(0, x, experts, begin, out)
            times.append(time.perf_counter() - t0)
        median = float(np.median(times[1:]))
        result = {"n_embd": N_EMBD, "expert_ff": FF, "gate_up": GATE_UP.name, "down": DOWN.name,
                  "n_expert": scale.n_expert, "rows_per_expert": scale.rows_per_expert, "rows": rows,
                  "threads": pool.threads, "workers_all": default_threads(), "isa": pool.isa,
                  "weight_bytes": weight_bytes, "read_bw_gbps": read_bw, "median_s": median,
                  "gb_per_s": weight_bytes / median / 1e9, "rows_per_s": rows / median}
    result["fraction_of_read_bw"] = result["gb_per_s"] / read_bw
    emit(f"run_groups: {scale.n_expert} experts x {scale.rows_per_expert} rows, {GATE_UP.name} gate/up, "
          f"{DOWN.name} down, {N_EMBD} x {FF}, {result['threads']} workers ({result['isa']})")
    emit(f"  weights {weight_bytes / 1e6:.0f} MB per call, median {median * 1e3:.1f} ms: "
          f"{result['gb_per_s']:.1f} GB/s ({100 * result['fraction_of_read_bw']:.0f} % of the pool's read "
          f"bandwidth {read_bw:.1f} GB/s), {result['rows_per_s']:.0f} rows/s")
    emit(f"RESULT pool_groups_q4k_q4_0_gbps={result['gb_per_s']:.1f} rows_per_s={result['rows_per_s']:.0f} "
          f"read_bw_gbps={read_bw:.1f} fraction_of_read_bw={result['fraction_of_read_bw']:.3f}")
    if json_path:
        write_json(json_path, result)
    return result
