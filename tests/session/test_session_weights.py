"""Dense weights uploaded to VRAM in canonical forms: the decode-step GEMV on them equals strata.quant.matvec."""

import numpy as np
import pytest

import strata
from strata import _native
from support.hooks import native_check as _native_check
from strata.format import inspect
from strata.runtime.loader import dense_names, repacked, upload_dense
from strata.quant import matvec
from strata.synth import synthesize

# Q8_0 dense, Q4_K experts (not uploaded), F32 norms: a mix a real file could carry.
TYPES = {"experts": "q4_k", "expert_down": "q4_k", "dense": "q8_0", "embeddings": "q6_k", "ple": "q8_0"}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("weights") / "tiny.gguf"
    synthesize(path, "qwen4exp", "tiny", types=TYPES, seed=11)
    with inspect(path) as model:
        yield model


def test_dense_names_leave_experts_and_the_ngram_table_on_the_host(model):
    names = dense_names(model)
    assert names and all("_exps." not in n and not n.startswith("per_layer_token_embd") for n in names)
    assert "output.weight" in names and "blk.0.ffn_gate_inp.weight" in names


@pytest.mark.gpu
@pytest.mark.hooks
def test_gemv_on_uploaded_weights_matches_the_reference(rng, model):
    held = dict(repacked(model, dense_names(model)))
    weights = upload_dense(model)
    assert weights.nbytes >= sum(h.nbytes for h in held.values())
    for name in ("output.weight", "blk.0.attn_qkv.weight", "blk.3.attn_q.weight", "blk.0.ffn_gate_inp.weight",
                 "blk.1.ple_key.weight", "blk.2.ssm_out.weight"):
        w = held[name]
        x = rng.standard_normal(w.shape[1] if isinstance(w, np.ndarray) else w.cols).astype(np.float32)
        got = _native_check.weights_gemv(weights, name, x)
        want = matvec(w, x)
        assert np.all(np.isfinite(got)), name
        err = np.max(np.abs(got - want)) / np.max(np.abs(want))
        # Integer inner sums are exact on both sides; float32 scaling order differs (docs/forms.md).
        assert err < 2e-6, (name, err)


@pytest.mark.gpu
@pytest.mark.hooks
def test_a_missing_tensor_and_a_wrong_width_are_named(rng, model):
    weights = upload_dense(model)
    with pytest.raises(strata.InvalidArgument, match="no tensor named blk.0.nope"):
        _native_check.weights_gemv(weights, "blk.0.nope", np.zeros(4, np.float32))
    with pytest.raises(strata.InvalidArgument, match="x has 3 entries, the tensor has"):
        _native_check.weights_gemv(weights, "output.weight", np.ones(3, np.float32))


def test_a_plane_of_the_wrong_size_is_refused_before_any_allocation(model):
    name = "blk.0.attn_qkv.weight"
    held = dict(repacked(model, [name]))[name]
    held.codes = held.codes[:, :-16]
    with pytest.raises(strata.InvalidArgument, match=f"tensor {name}: plane codes has"):
        _native.DeviceWeights({name: held}, 0)


def test_a_second_load_reads_the_repack_cache_instead_of_repacking(tmp_path, model, monkeypatch):
    import strata.runtime.loader as loader

    cache_path = tmp_path / "dense.strataqc"
    first = loader.dense_weights(model, cache_path)
    assert cache_path.stat().st_size > 0

    def no_repack(*args, **kwargs):
        raise AssertionError("repack called although a valid cache exists")

    monkeypatch.setattr(loader, "repack", no_repack)
    second = loader.dense_weights(model, cache_path)
    assert second.keys() == first.keys() == set(dense_names(model))
    for name, held in first.items():
        again = second[name]
        if isinstance(held, np.ndarray):
            assert np.array_equal(held, again), name
        else:
            assert all(np.array_equal(a, b) for a, b in zip(held.planes().values(), again.planes().values())), name
