"""The GPU <-> CPU expert exchange of a decode token in the session's three modes.

Per MoE layer the GPU publishes x, ids and weights into mapped pinned memory and rings; the host answers
with the CPU pool; the GPU consumes the combined row. The factor (t + 1) the GPU applies comes from
per-token staging, so a captured graph that replayed stale values would fail here.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import strata
from strata import _native
from support.hooks import native_check as _native_check
from strata.options import Mode
from strata.quant import repack
from strata.quant.synthetic import random_blocks
from strata.runtime.pool import ExpertPool

pytestmark = pytest.mark.hooks

N, FF, N_EXPERT, K, LAYERS, TOKENS = 256, 64, 16, 4, 5, 3


def make_pool(rng: np.random.Generator) -> ExpertPool:
    pool = ExpertPool(N, FF, K, threads=1, pin_caller=False)
    for layer in range(LAYERS):  # different experts in every layer: mixing layers up cannot pass
        gate, up = (repack(random_blocks(T.Q4_0, N * FF * N_EXPERT, rng), T.Q4_0, (N, FF, N_EXPERT)) for _ in "gu")
        down = repack(random_blocks(T.Q4_0, N * FF * N_EXPERT, rng), T.Q4_0, (FF, N, N_EXPERT))
        pool.set_layer(layer, gate, up, down, N_EXPERT)
    return pool


def routing(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = rng.standard_normal((LAYERS, N)).astype(np.float32)
    ids = np.stack([rng.choice(N_EXPERT, K, replace=False) for _ in range(LAYERS)]).astype(np.int32)
    weights = rng.dirichlet(np.ones(K), LAYERS).astype(np.float32)
    return x, ids, weights


def answers(pool: ExpertPool, x: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """What the exchange must return: token t's layer l answer is the pool's own rows for x[l] * (t + 1), summed."""
    return np.stack([
        np.stack([pool.run_layer(l, x[l] * (t + 1), ids[l], weights[l]).sum(axis=0) for l in range(LAYERS)])
        for t in range(TOKENS)
    ])


@pytest.fixture
def pool(rng):
    with make_pool(rng) as pool:
        yield pool


@pytest.mark.gpu
def test_every_mode_returns_this_layers_experts_for_every_token(rng, pool):
    x, ids, weights = routing(rng)
    want = answers(pool, x, ids, weights)
    results = {}
    for mode in Mode:
        out, timing = _native_check.expert_exchange(pool.native, mode, x, ids, weights, TOKENS)
        assert np.all(np.isfinite(out)), mode
        # The pool's own rows, summed in another order: float32 rounding only.
        err = np.max(np.abs(out - want)) / np.max(np.abs(want))
        assert err < 1e-6, (mode, err)
        assert timing["rings"] == LAYERS * TOKENS
        results[mode] = out
    # Same pool, same sums: the three modes agree bit for bit.
    assert np.array_equal(results[Mode.UNCAPTURED], results[Mode.LAYER_GRAPHS])
    assert np.array_equal(results[Mode.UNCAPTURED], results[Mode.TOKEN_GRAPH])


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(Mode))
@pytest.mark.parametrize("crossing", [2**31, 2**32])
def test_rings_stay_in_order_where_their_numbers_wrap(rng, pool, mode, crossing):
    """A long-lived session's ring numbers pass 2^31 (the sign of an int) and 2^32 (back to 0) inside a token:
    every answer still belongs to its layer and token."""
    first_token = crossing // LAYERS - 1   # the second token's rings cross `crossing`
    x, ids, weights = routing(rng)
    want = answers(pool, x, ids, weights)
    out, timing = _native_check.expert_exchange(pool.native, mode, x, ids, weights, TOKENS, first_token=first_token)
    assert np.all(np.isfinite(out)), mode
    assert np.max(np.abs(out - want)) / np.max(np.abs(want)) < 1e-6, mode
    assert timing["rings"] == LAYERS * TOKENS


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(Mode))
@pytest.mark.parametrize("first_token", [0, 2**32 // LAYERS])
def test_a_layer_that_never_rings_is_named(rng, pool, mode, first_token):
    x, ids, weights = routing(rng)
    with pytest.raises(strata.StrataError, match="layer 2 never rang"):
        _native_check.expert_exchange(pool.native, mode, x, ids, weights, 2, never_ring_layer=2, timeout=0.2,
                                      first_token=first_token)


# (first token, layer never answered, its ring): from the start, and where the ring numbers wrap to 0 (token
# 2^32 // 5's base is 2^32 - 1, so its layer 0 rings 0: the wait's status word must not read that as "none").
NEVER_ANSWERED = [(0, 3, 4), (2**32 // LAYERS, 3, 3), (2**32 // LAYERS, 0, 0)]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(Mode))
@pytest.mark.parametrize("first_token, layer, ring", NEVER_ANSWERED)
def test_a_layer_never_answered_is_named(rng, pool, mode, first_token, layer, ring):
    x, ids, weights = routing(rng)
    with pytest.raises(strata.StrataError, match=f"layer {layer}: the host's answer to ring {ring} never arrived"):
        _native_check.expert_exchange(pool.native, mode, x, ids, weights, 1, never_answer_layer=layer, timeout=0.2,
                                      first_token=first_token)


def test_bad_arguments_are_named(rng, pool):
    x, ids, weights = routing(rng)
    with pytest.raises(strata.InvalidArgument, match="unknown session mode 'bogus'"):
        _native_check.expert_exchange(pool.native, "bogus", x, ids, weights, 1)
    with pytest.raises(strata.InvalidArgument, match="must both be n_layer x k"):
        _native_check.expert_exchange(pool.native, Mode.TOKEN_GRAPH, x, ids[:2], weights, 1)
    if _native.device_count() == 0:
        with pytest.raises(strata.InvalidArgument, match="device index 0 out of range: 0 CUDA device"):
            _native_check.expert_exchange(pool.native, Mode.TOKEN_GRAPH, x, ids, weights, 1)
