"""strata.reference end to end on synthetic GGUF files: chunked prompts equal token-by-token decoding, dumps,
reset, the activation-quantization switch, and argument errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from strata import quant
from strata.errors import FormatError, InvalidArgument
from strata.format import inspect
from strata.reference import Reference
from strata.reference.weights import FileWeights
from strata.synth import synthesize

ARCHS = ["qwen4exp", "qwen3next", "qwen35moe"]
SEQ = 30      # the tiny qwen4exp keeps 2 QSA blocks, so rows from 12 visible tokens on drop blocks


@pytest.fixture(scope="module", params=ARCHS)
def model_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthesize(tmp_path_factory.mktemp(request.param) / "m.gguf", request.param, "tiny")


def _ids(rng: np.random.Generator, mf) -> np.ndarray:
    ids = rng.integers(0, mf.geometry.n_vocab, SEQ)
    if mf.geometry.ple_layers:
        ids[[3, 4, 17]] = mf.geometry.ple_eos
    return ids


def test_chunks_equal_token_by_token(model_path: Path, rng: np.random.Generator) -> None:
    with inspect(model_path) as mf:
        ids = _ids(rng, mf)
        ref = Reference(mf)
        whole = ref.forward(ids)
        ref.reset()
        steps = np.concatenate([ref.forward(ids[i:i + 1]) for i in range(SEQ)])
        ref.reset()
        mixed = np.concatenate([ref.forward(ids[:7]), ref.forward(ids[7:8]), ref.forward(ids[8:])])
    assert np.isfinite(whole).all() and whole.shape == (SEQ, mf.geometry.n_vocab)
    # Every row is computed by the same per-row float64 formulas whatever the chunking; only BLAS blocking
    # of batched float64 products may differ, far below float32 resolution.
    scale = np.abs(whole).max()
    np.testing.assert_allclose(steps, whole, rtol=0, atol=1e-6 * scale)
    np.testing.assert_allclose(mixed, whole, rtol=0, atol=1e-6 * scale)


def test_dumps_describe_every_layer(model_path: Path, rng: np.random.Generator) -> None:
    with inspect(model_path) as mf:
        g = mf.geometry
        ids = _ids(rng, mf)
        logits, dumps = Reference(mf).forward(ids, dump=True)
    streams = g.hc_count if g.arch == "qwen4exp" else 1
    assert len(dumps) == g.n_layer
    for layer, d in enumerate(dumps):
        assert d["mixer_out"].shape == (SEQ, g.n_embd)
        assert d["streams_after_mixer"].shape == d["streams_after_ffn"].shape == (SEQ, streams, g.n_embd)
        assert d["router_ids"].shape == d["router_weights"].shape == (SEQ, g.n_expert_used)
        np.testing.assert_allclose(d["router_weights"].sum(axis=1), 1.0, rtol=1e-6)
        assert ("qsa_blocks" in d) == (g.arch == "qwen4exp" and not g.recurrent[layer])
        assert ("ple_out" in d) == (layer in g.ple_layers)
        for p, blocks in enumerate(d.get("qsa_blocks", [])):
            assert len(blocks) == min(g.indexer_top_k // 4, (p + 1) // 4)


def test_reset_starts_a_new_sequence(model_path: Path, rng: np.random.Generator) -> None:
    with inspect(model_path) as mf:
        ids = _ids(rng, mf)
        ref = Reference(mf)
        first = ref.forward(ids[:5])
        ref.forward(ids[5:])
        ref.reset()
        assert ref.n_past == 0
        np.testing.assert_array_equal(ref.forward(ids[:5]), first)


def test_activation_quant_routes_products_through_quant_matvec(tmp_path: Path, rng: np.random.Generator) -> None:
    path = synthesize(tmp_path / "q.gguf", "qwen35moe", "tiny", types="Q4_0")
    with inspect(path) as mf:
        name = "blk.0.attn_qkv.weight"
        info = mf.tensors[name]
        x = rng.standard_normal((3, mf.geometry.n_embd)).astype(np.float32)
        got = FileWeights(mf, activation_quant=True).matmul(name, x)
        want = quant.matvec(quant.repack(mf.raw(name), info.ggml_type, info.ne), x)
        np.testing.assert_array_equal(got, want)
        ids = rng.integers(0, mf.geometry.n_vocab, 6)
        exact, exact_dump = Reference(mf).forward(ids, dump=True)
        quantized, quant_dump = Reference(mf, activation_quant=True).forward(ids, dump=True)
    assert np.isfinite(quantized).all()
    assert not np.array_equal(exact, quantized)
    # One layer chains a handful of products, each off by ~0.5% from q8_32 rounding (1/254 of a block's
    # maximum); random synthetic weights then amplify it from layer to layer, so only layer 0 is bounded here. Its
    # mixer amplifies too, now and then (an input of small norm, normalised): over 1,500 seeds the relative L2
    # error had a median of 1.3 % and a worst of 14 % (max-abs against 5 % failed about one seed in 30), so the
    # bound is the L2 norm's, at 2.5x that worst.
    first, first_q = exact_dump[0]["mixer_out"], quant_dump[0]["mixer_out"]
    assert np.linalg.norm(first_q - first) <= 0.35 * np.linalg.norm(first)


def test_argument_errors(tmp_path: Path) -> None:
    path = synthesize(tmp_path / "e.gguf", "qwen3next", "tiny")
    with inspect(path) as mf:
        ref = Reference(mf)
        with pytest.raises(InvalidArgument, match="token ids"):
            ref.forward([mf.geometry.n_vocab])
        with pytest.raises(InvalidArgument, match="at least one"):
            ref.forward([])
        with pytest.raises(InvalidArgument, match="context length"):
            ref.forward(np.zeros(mf.geometry.context_length + 1, dtype=np.int64))
        source = FileWeights(mf)
        weights = {name: source.get(name) for name in mf.tensors if name != "blk.0.attn_qkv.weight"}
        broken = Reference(geometry=mf.geometry, weights=weights)
        with pytest.raises(FormatError, match="blk.0.attn_qkv.weight"):
            broken.forward([1])
    with pytest.raises(InvalidArgument):
        Reference()
