"""The CPU expert pool's control surface: pinning and its undoing, idle parking, ISA choice, argument checks."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import strata
import strata.runtime.pool
from strata.quant import repack
from strata.quant.synthetic import random_blocks

_native = pytest.importorskip("strata._native")
N_EMBD, FF, N_EXPERT = 256, 128, 4
pytestmark = pytest.mark.skipif(not _native.cpu_isa_support()["avx2"], reason="CPU lacks AVX2+FMA+F16C")


def small_layer(rng: np.random.Generator, ggml_type: T = T.Q4_0):
    def make(cols: int, rows: int):
        return repack(random_blocks(ggml_type, cols * rows * N_EXPERT, rng), ggml_type, (cols, rows, N_EXPERT))

    return make(N_EMBD, FF), make(N_EMBD, FF), make(FF, N_EMBD)


def run_once(pool: strata.runtime.pool.ExpertPool, rng: np.random.Generator) -> np.ndarray:
    out = pool.run_layer(0, rng.standard_normal(N_EMBD, dtype=np.float32), np.array([0, 3], np.int32),
                         np.array([0.5, 0.25], np.float32))
    assert np.all(np.isfinite(out))
    return out


def test_caller_pinned_to_first_core_and_restored(rng):
    before = os.sched_getaffinity(0)
    cores = strata.runtime.pool.physical_cores()
    with strata.runtime.pool.ExpertPool(N_EMBD, FF, 2) as pool:
        if len(cores) > 1:
            assert os.sched_getaffinity(0) == set(cores[0][0])
            worker_cpus = {c for cpus in pool.worker_cpus for c in cpus}
            assert not worker_cpus & set(cores[0][0]), "a worker shares the host loop's core"
            assert len(pool.worker_cpus) == strata.runtime.pool.default_threads()
            assert pool.participants == pool.threads + 1, "the pinned caller does not take part in its jobs"
    assert os.sched_getaffinity(0) == before


def test_unpinned_caller_keeps_its_affinity():
    before = os.sched_getaffinity(0)
    with strata.runtime.pool.ExpertPool(N_EMBD, FF, 2, pin_caller=False) as pool:
        assert os.sched_getaffinity(0) == before
        if before & {c for cpus in pool.worker_cpus for c in cpus}:
            assert pool.participants == pool.threads, "a caller on a worker's CPU took part in a job"
    assert os.sched_getaffinity(0) == before


def test_jobs_from_a_thread_on_the_workers_cpus_match(rng):
    """The caller pinned apart takes work items; a thread that may run on the workers' CPUs only waits for them:
    the same bits either way."""
    gate, up, down = small_layer(rng)
    x = rng.standard_normal(N_EMBD, dtype=np.float32)
    ids, weights = np.array([3, 0], np.int32), np.array([0.7, 0.2], np.float32)
    with strata.runtime.pool.ExpertPool(N_EMBD, FF, 2) as pool:
        pool.set_layer(0, gate, up, down, n_expert=N_EXPERT)
        here = pool.run_layer_sum(0, x, ids, weights)
        there = []
        worker = threading.Thread(target=lambda: there.append(pool.run_layer_sum(0, x, ids, weights)))
        worker.start()
        worker.join()
        np.testing.assert_array_equal(here.view(np.uint32), there[0].view(np.uint32))
        assert np.all(np.isfinite(here)) and np.any(here != 0)


def test_idle_workers_park_and_wake(rng):
    with strata.runtime.pool.ExpertPool(N_EMBD, FF, 2, spin_us=1000) as pool:
        pool.set_layer(0, *small_layer(rng), n_expert=N_EXPERT)
        first = run_once(pool, rng)
        deadline = time.monotonic() + 5.0
        while pool.parked_workers < pool.threads and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.parked_workers == pool.threads, "idle workers kept spinning"
        assert run_once(pool, rng).shape == first.shape  # parked workers wake for the next job


def test_isa_override_by_argument_and_env(monkeypatch):
    with strata.runtime.pool.ExpertPool(N_EMBD, FF, 1, isa="avx2") as pool:
        assert pool.isa == "avx2"
    monkeypatch.setenv("STRATA_CPU_ISA", "avx2")
    with strata.runtime.pool.ExpertPool(N_EMBD, FF, 1) as pool:
        assert pool.isa == "avx2"
    monkeypatch.setenv("STRATA_CPU_ISA", "sse9")
    with pytest.raises(strata.InvalidArgument, match="STRATA_CPU_ISA must be avx2 or avx512, found 'sse9'"):
        strata.runtime.pool.ExpertPool(N_EMBD, FF, 1)


def test_avx512_refused_where_missing():
    if _native.cpu_isa_support()["avx512"]:
        pytest.skip("this CPU has AVX-512 VNNI")
    with pytest.raises(strata.InvalidArgument, match="avx512 requested"):
        strata.runtime.pool.ExpertPool(N_EMBD, FF, 1, isa="avx512")


def test_bad_arguments_are_named(rng):
    with pytest.raises(strata.InvalidArgument, match="n_embd must be a multiple of 32"):
        strata.runtime.pool.ExpertPool(100, FF, 1)
    with pytest.raises(strata.InvalidArgument, match="exceeds the .* worker CPUs"):
        strata.runtime.pool.ExpertPool(N_EMBD, FF, 1, threads=10_000)
    gate, up, down = small_layer(rng)
    with strata.runtime.pool.ExpertPool(N_EMBD, FF, 2) as pool:
        with pytest.raises(strata.InvalidArgument, match="layer 0 down: expected 256 x 128 per expert, found 128 x 256"):
            pool.set_layer(0, gate, up, gate, n_expert=N_EXPERT)
        with pytest.raises(strata.InvalidArgument, match="rows do not split into 3 experts"):
            pool.set_layer(0, gate, up, down, n_expert=3)
        with pytest.raises(strata.InvalidArgument, match="layer 5 has no experts registered"):
            pool.run_layer(5, np.ones(N_EMBD), np.array([0]), np.ones(1))
        pool.set_layer(0, gate, up, down, n_expert=N_EXPERT)
        with pytest.raises(strata.InvalidArgument, match=r"ids\[1\] = 4 is outside 0..3"):
            pool.run_layer(0, np.ones(N_EMBD), np.array([0, 4]), np.ones(2))
        with pytest.raises(strata.InvalidArgument, match="k must be in 0..2"):
            pool.run_layer(0, np.ones(N_EMBD), np.arange(3), np.ones(3))
        with pytest.raises(strata.InvalidArgument, match=r"run_layer_sum: layer 0 ids\[0\] = -1 is outside 0..3"):
            pool.run_layer_sum(0, np.ones(N_EMBD), np.array([-1, 2]), np.ones(2))
        with pytest.raises(strata.InvalidArgument, match="run_layer_sum: k must be in 0..2"):
            pool.run_layer_sum(0, np.ones(N_EMBD), np.arange(3), np.ones(3))
        with pytest.raises(strata.InvalidArgument, match="run_layer_sum: out has 5 entries, n_embd is 256"):
            pool.run_layer_sum(0, np.ones(N_EMBD), np.arange(2), np.ones(2), out=np.zeros(5, np.float32))
        with pytest.raises(strata.InvalidArgument, match="run_layer_sum: ids has 2 entries; weights 3"):
            pool.run_layer_sum(0, np.ones(N_EMBD), np.arange(2), np.ones(3))


def test_plane_size_mismatch_names_the_plane(rng):
    gate, up, down = small_layer(rng)
    with strata.runtime.pool.ExpertPool(N_EMBD, FF, 1) as pool:
        spec, _keep = strata.runtime.pool.matrix_spec(gate, N_EXPERT, "gate")
        address, nbytes = spec["planes"]["d"]
        spec["planes"]["d"] = (address, nbytes - 2)
        up_spec, _u = strata.runtime.pool.matrix_spec(up, N_EXPERT, "up")
        down_spec, _d = strata.runtime.pool.matrix_spec(down, N_EXPERT, "down")
        with pytest.raises(strata.InvalidArgument, match=f"layer 2 gate: plane d has {nbytes - 2} bytes, expected {nbytes}"):
            pool._native.set_layer(2, spec, up_spec, down_spec)


def test_read_bandwidth_is_positive():
    with strata.runtime.pool.ExpertPool(N_EMBD, FF, 1) as pool:
        assert pool.read_bandwidth(64 << 20, reps=2) > 1e8  # any machine reads more than 100 MB/s


def test_float_matrices_are_checked(rng):
    gate, up, down = small_layer(rng, T.BF16)
    with strata.runtime.pool.ExpertPool(N_EMBD, FF, 1) as pool:
        refused = r"layer 0 up: the CPU pool takes a QuantTensor or a 2-D float32, float16 or uint16 \(bf16 bits\)"
        with pytest.raises(strata.InvalidArgument, match=refused + " array; found float64"):
            pool.set_layer(0, gate, up.astype(np.float64), down, n_expert=N_EXPERT)
        specs = [strata.runtime.pool.matrix_spec(m, N_EXPERT, "spec")[0] for m in (gate, up, down)]
        address, nbytes = specs[0]["planes"]["codes"]
        specs[0]["planes"]["codes"] = (address, nbytes - 2)
        short = rf"layer 2 gate: plane codes \(the float elements\) has {nbytes - 2} bytes, expected {nbytes}"
        with pytest.raises(strata.InvalidArgument, match=short):
            pool._native.set_layer(2, *specs)
        specs[0]["planes"] = {"codes": (address, nbytes), "d": (address, 64)}
        with pytest.raises(strata.InvalidArgument, match="layer 2 gate: the form has no d plane, but one of 64 bytes"):
            pool._native.set_layer(2, *specs)
    _native_check = pytest.importorskip("strata._native_check")
    with pytest.raises(strata.InvalidArgument, match="expert_matvec: cols 48 is not a multiple of 32"):
        _native_check.expert_matvec("avx2", np.ones((4, 48), np.float16), np.ones(48, np.float32))
