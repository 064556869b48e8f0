"""strata.load: memory checks before any allocation, experts from the file into the CPU pool, clean failure."""

import importlib

import numpy as np
import pytest
from support.pool_reference import check_expert

import strata
from support.hooks import native_check as _native_check
from strata.runtime import model as model_module
from strata.devices import Device
from strata.format import inspect
from strata.runtime.host import meminfo_bytes
from strata.runtime.loader import gpu_refusals, load_experts, split_gate_up
from strata import api
from strata.runtime.model import Model, describe, load
from strata.runtime.pool import ExpertPool
from strata.quant import dequantize, matvec, repack
from strata.quant.synthetic import random_blocks
from strata.synth import synthesize
from gguf import GGMLQuantizationType as T

TYPES = {"experts": "q4_k", "expert_down": "q4_k", "dense": "q8_0", "embeddings": "q8_0", "ple": "q8_0"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("load") / "tiny.gguf"
    synthesize(path, "qwen4exp", "tiny", types=TYPES, seed=5)
    return path


def test_host_available_reads_memavailable():
    assert meminfo_bytes("MemTotal: 10 kB\nMemAvailable:   2048 kB\n", "MemAvailable") == 2048 * 1024
    assert meminfo_bytes("MemTotal: 10 kB\n", "MemAvailable") == 0


@pytest.mark.parametrize("ggml_type", [T.Q4_K, T.BF16])
def test_merged_gate_up_splits_per_expert(rng, ggml_type):
    n_expert, ff, cols = 3, 32, 256
    merged = repack(random_blocks(ggml_type, cols * 2 * ff * n_expert, rng), ggml_type, (cols, 2 * ff, n_expert))
    gate, up = split_gate_up(merged, n_expert)
    full = dequantize(merged).reshape(n_expert, 2 * ff, cols)
    assert np.array_equal(dequantize(gate).reshape(n_expert, ff, cols), full[:, :ff])
    assert np.array_equal(dequantize(up).reshape(n_expert, ff, cols), full[:, ff:])


# Routed experts of every kind the loader hands the pool: quantized, float, and float gate/up with a quantized down.
EXPERT_MIXES = {"q4_k": TYPES, "f16+bf16": {"experts": "f16", "expert_down": "bf16"},
                "bf16+q8_0": {"experts": "bf16", "expert_down": "q8_0"},
                "f32": {"experts": "f32", "expert_down": "f32"}}


@pytest.fixture(scope="module", params=list(EXPERT_MIXES))
def expert_file(request, tmp_path_factory, tiny):
    if request.param == "q4_k":
        return tiny
    path = tmp_path_factory.mktemp("load") / f"{request.param}.gguf"
    synthesize(path, "qwen4exp", "tiny", types=EXPERT_MIXES[request.param], seed=5)
    return path


@pytest.mark.hooks
def test_experts_go_from_the_file_into_the_pool_unchanged(rng, expert_file):
    with inspect(expert_file) as file:
        g = file.geometry
        assert gpu_refusals(file) == []  # float routed experts run too
        with ExpertPool(g.n_embd, g.expert_ff, g.n_expert_used, threads=1, pin_caller=False) as pool:
            load_experts(file, pool, None)
            # The memory plan counts exactly what the pool holds.
            held = sum(pool.layer_bytes(layer) for layer in range(g.n_layer)) * g.n_expert
            assert describe(file).plan.host["routed experts"] == held
            layer = g.n_layer - 1
            ids = rng.choice(g.n_expert, g.n_expert_used, replace=False).astype(np.int32)
            weights = rng.dirichlet(np.ones(g.n_expert_used)).astype(np.float32)
            x = rng.standard_normal(g.n_embd).astype(np.float32)
            got = pool.run_layer(layer, x, ids, weights)

            def expert(name, e):
                info = file.tensors[f"blk.{layer}.{name}.weight"]
                q = repack(file.raw(f"blk.{layer}.{name}.weight"), info.ggml_type, info.ne)
                if isinstance(q, np.ndarray):
                    return q.reshape(g.n_expert, -1, q.shape[1])[e]
                rows = q.rows // g.n_expert
                planes = {k: v[e * rows:(e + 1) * rows] for k, v in q.planes().items()}
                return type(q)(q.form, rows, q.cols, **planes)

            for j, e in enumerate(ids):
                check_expert(pool.isa, expert("ffn_gate_exps", e), expert("ffn_up_exps", e),
                             expert("ffn_down_exps", e), x, float(weights[j]), got[j], f"slot {j}, expert {e}")


def test_a_model_too_big_for_the_gpu_is_refused_with_what_would_fit(tiny, monkeypatch):
    fake = Device(0, "small GPU", (9, 0), 1 << 30, 2_000_000, 132)
    monkeypatch.setattr(importlib.import_module("strata.devices"), "devices", lambda: [fake])
    with pytest.raises(strata.OutOfMemory, match=r"GPU 0 has 0.00 GiB free; the plan of context 256 .* nothing fits"):
        load(tiny, progress=False)


def test_no_gpu_is_an_invalid_argument_and_closes_the_file(tiny, monkeypatch):
    monkeypatch.setattr(importlib.import_module("strata.devices"), "devices", lambda: [])
    closed = []
    real_inspect = model_module.inspect

    def tracking_inspect(path):
        file = real_inspect(path)
        original = file.close
        file.close = lambda: (closed.append(True), original())
        return file

    monkeypatch.setattr(model_module, "inspect", tracking_inspect)
    with pytest.raises(strata.InvalidArgument, match="device index 0 out of range: 0 CUDA device"):
        load(tiny, progress=False)
    assert closed


def test_info_reports_types_and_the_plan(tiny):
    with inspect(tiny) as file:
        info = describe(file)
    assert info.arch == "qwen4exp" and info.tensor_types["Q4_K"] > 0
    assert info.plan.host["routed experts"] > 0 and info.plan.vram["dense weights"] > 0


@pytest.mark.gpu
@pytest.mark.hooks
def test_load_puts_every_part_in_place(rng, tiny, tmp_path):
    with load(tiny, threads=1, cache_dir=tmp_path, progress=False) as model:
        g = model.info.geometry
        x = rng.standard_normal(g.n_embd).astype(np.float32)
        info = model.file.tensors["output.weight"]
        want = matvec(repack(model.file.raw("output.weight"), info.ggml_type, info.ne), x)
        got = _native_check.weights_gemv(model.weights, "output.weight", x)
        assert np.max(np.abs(got - want)) < 2e-6 * np.max(np.abs(want))
    assert any(tmp_path.iterdir())  # the dense cache was written


def test_the_public_names_resolve():
    assert strata.load is api.load and strata.Model is Model and strata.KV.INT8.value == "int8"
    for name in ("load", "Model", "Session", "Mode", "ReferenceModel", "Completion"):
        assert name in dir(strata), name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        strata.nope
