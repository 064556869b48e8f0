"""Expert deferral in the numpy reference (docs/session.md, "Expert deferral"): off, the exact model bit for bit;
on, the logits move; a layer's routed sum splits exactly into what is answered and what is deferred; the last
layer defers nothing; out of range, refused with the limit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.deferral_models import ROUTED, synthesize_routing

from strata.errors import InvalidArgument
from strata.format import inspect
from strata.reference import Reference
from strata.reference.moe import moe_forward
from strata.reference.weights import FileWeights

TOKENS = 6
# The least max|diff|/max|logit| deferral makes at any token of these models: the deferred experts carry a
# quarter or more of a layer's routed output, moved past a whole layer (measured: several 1e-2 and up).
EFFECT = 1e-3


@pytest.fixture(scope="module", params=["qwen4exp", "qwen3next"])  # hyper-connections, and one stream
def model_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthesize_routing(tmp_path_factory.mktemp(request.param) / "m.gguf", request.param)


def decode(mf, ids: np.ndarray, **options) -> np.ndarray:
    """The logits after each of `ids` fed one by one."""
    reference = Reference(mf, **options)
    return np.concatenate([reference.forward(ids[i:i + 1]) for i in range(len(ids))])


def test_no_deferral_is_the_exact_model_bit_for_bit(model_path: Path, rng: np.random.Generator) -> None:
    with inspect(model_path) as mf:
        ids = rng.integers(0, mf.geometry.n_vocab, TOKENS)
        exact, off = decode(mf, ids), decode(mf, ids, defer_experts=0)
    assert np.array_equal(exact.view(np.uint32), off.view(np.uint32))


@pytest.mark.parametrize("defer", [1, 3])
def test_deferral_moves_the_logits_of_every_token(model_path: Path, defer: int, rng: np.random.Generator) -> None:
    with inspect(model_path) as mf:
        ids = rng.integers(0, mf.geometry.n_vocab, TOKENS)
        exact, deferred = decode(mf, ids), decode(mf, ids, defer_experts=defer)
    assert np.isfinite(deferred).all()
    change = np.abs(deferred - exact).max(axis=1) / np.abs(exact).max(axis=1)
    print(f"defer {defer}: max|diff|/max|logit| per token {np.array2string(change, precision=3)}")
    assert (change > EFFECT).all(), change


def test_a_layers_routed_sum_splits_into_the_answered_and_the_deferred(model_path: Path,
                                                                        rng: np.random.Generator) -> None:
    with inspect(model_path) as mf:
        g, weights = mf.geometry, FileWeights(mf)
        x = rng.standard_normal((3, g.n_embd)).astype(np.float32)
        whole, ids, w, none = moe_forward(weights, 1, x, g.n_expert_used, g.expert_ff)
        answered, ids3, w3, deferred = moe_forward(weights, 1, x, g.n_expert_used, g.expert_ff, defer=3)
        lightest, _, _, _ = moe_forward(weights, 1, x, g.n_expert_used, g.expert_ff, defer=1)
    assert not none.any() and np.array_equal(ids, ids3) and np.array_equal(w, w3)
    assert (np.diff(w, axis=1) <= 0).all()  # descending weight: the deferred are the lightest
    scale = np.abs(whole).max()
    # Each part is a float64 sum rounded once to float32: together they are the whole to float32 rounding.
    np.testing.assert_allclose(answered + deferred, whole, rtol=0, atol=1e-6 * scale)
    assert np.abs(deferred).max() > 1e-3 * scale and np.abs(whole - lightest).max() > 1e-3 * scale


def test_the_last_layer_defers_nothing(tmp_path: Path, rng: np.random.Generator) -> None:
    # One layer: it is the last, with no layer after it to hide the pool's work behind.
    path = synthesize_routing(tmp_path / "one.gguf", "qwen3next", n_layer=1)
    with inspect(path) as mf:
        ids = rng.integers(0, mf.geometry.n_vocab, TOKENS)
        exact, deferred = decode(mf, ids), decode(mf, ids, defer_experts=ROUTED - 1)
    assert np.array_equal(exact.view(np.uint32), deferred.view(np.uint32))


@pytest.mark.parametrize("defer", [-1, ROUTED, 2.0, True])
def test_a_deferral_outside_the_routed_experts_is_refused_with_the_limit(model_path: Path, defer) -> None:
    with inspect(model_path) as mf, pytest.raises(
            InvalidArgument, match=rf"defer_experts must be in 0..{ROUTED - 1} \(below the {ROUTED} routed experts"):
        Reference(mf, defer_experts=defer)
