"""Expert deferral on the GPU (docs/session.md, "Expert deferral"): a decode token with d = 1 or 3 of its 4
routed experts deferred, against the reference with the same deferral, in every mode; off, bit for bit the
session without the option; with an expert cache, the layers that ring no doorbell defer nothing; refusals."""

import numpy as np
import pytest
from support.compare import relative_errors
from support.deferral_models import ROUTED, synthesize_routing
from support.native_session import open_native_session, stepped_logits

from strata import _native
from strata.errors import InvalidArgument
from strata.options import Mode
from strata.reference import Reference
from strata.runtime.model import load

pytestmark = pytest.mark.gpu

FLOAT = {"experts": "q8_0", "expert_down": "q8_0", "dense": "f32", "embeddings": "f32", "ple": "f32"}
QUANT = {"experts": "q4_k", "expert_down": "q4_0", "dense": "q8_0", "embeddings": "q8_0", "ple": "q8_0"}
# Hyper-connections (the deferred row takes its own layer's injection weights) and one stream (a plain add).
CASES = {"qwen4exp-f32": ("qwen4exp", FLOAT), "qwen3next-quant": ("qwen3next", QUANT)}
STEPS = 24
# tests/session/test_decode_session.py's bounds for bf16 KV (its comment says where they come from): deferral adds no
# rounding of its own, it moves where a row is added; the pool sums the answered and the deferred rows apart.
MEDIAN = {"float": 4e-3, "quant": 1.5e-2}
STEADY, GARBAGE = 0.15, 1.0
# Deferral moves these models' logits by a median max|diff|/max|logit| of 2.7e-2..7e-2 (qwen4exp) and 0.1..0.34
# (qwen3next), measured on the reference (3 id seeds, d = 1 and 3): more than EFFECT times the bound, so a GPU
# that left deferral out would fail it.
EFFECT = 4


@pytest.fixture(scope="module", params=sorted(CASES))
def loaded(request, tmp_path_factory):
    arch, types = CASES[request.param]
    path = synthesize_routing(tmp_path_factory.mktemp("defer") / f"{request.param}.gguf", arch, types, seed=11)
    model = load(path, progress=False, expert_cache=0)
    yield request.param, model
    model.close()


def session(model, mode, defer=None, cache=None):
    """A native session; `defer` None leaves the option out (the session as it was before it existed)."""
    options = {} if defer is None else {"defer_experts": defer}
    return open_native_session(model, context=64, kv="bf16", mode=mode, cache=cache, **options)


def reference_logits(model, ids, defer=0):
    """The reference's logits after each of `ids`, with the GPU's activation quantization."""
    reference = Reference(model.file, activation_quant=True, defer_experts=defer)
    return np.array([reference.forward([int(t)])[-1] for t in ids])


@pytest.mark.parametrize("defer", [1, 3])
def test_deferred_decode_matches_the_deferred_reference_in_every_mode(loaded, defer, rng):
    name, model = loaded
    dense = "quant" if name.endswith("quant") else "float"
    ids = rng.integers(0, model.info.geometry.n_vocab, STEPS)
    ref = reference_logits(model, ids, defer)
    # The change deferral makes is far above the bounds below, so a GPU that ignored it would fail them.
    assert np.median(relative_errors(ref, reference_logits(model, ids))) > EFFECT * MEDIAN[dense], (name, defer)
    runs = {}
    for mode in Mode:
        runs[mode] = stepped_logits(session(model, mode, defer), model, ids)
        assert np.all(np.isfinite(runs[mode])), (name, mode)
        errors = relative_errors(runs[mode], ref)
        print(f"{name} defer {defer} {mode.value}: median {np.median(errors):.2e}, worst {errors.max():.2e}")
        assert np.median(errors) < MEDIAN[dense], (name, defer, mode, errors)
        assert np.quantile(errors, 0.9) < STEADY, (name, defer, mode, errors)
        assert errors.max() < GARBAGE, (name, defer, mode, errors)
    for mode in (Mode.LAYER_GRAPHS, Mode.TOKEN_GRAPH):
        assert np.array_equal(runs[mode], runs[Mode.UNCAPTURED]), (name, defer, mode)


def test_no_deferral_is_the_session_without_the_option_bit_for_bit(loaded, rng):
    name, model = loaded
    ids = rng.integers(0, model.info.geometry.n_vocab, 12)
    for mode in Mode:
        without = stepped_logits(session(model, mode), model, ids)
        off = stepped_logits(session(model, mode, 0), model, ids)
        assert np.array_equal(without.view(np.uint32), off.view(np.uint32)), (name, mode)


def expert_cache(model, counts, rng):
    """A cache holding counts[l] random experts of layer l."""
    g = model.info.geometry
    cache = _native.ExpertCache(model.pool.native, counts, 0, host_weights=model.pool.host_weights())
    for layer, count in enumerate(counts):
        if count:
            cache.hold(layer, rng.permutation(g.n_expert)[:count])
    return cache


def test_layers_beside_a_wholly_cached_layer_defer_nothing(loaded, rng):
    name, model = loaded
    g = model.info.geometry
    ids = rng.integers(0, g.n_vocab, 10)
    # Every layer whole: none rings, so none defers and the token is the exact one.
    whole = expert_cache(model, [g.n_expert] * g.n_layer, rng)
    exact = stepped_logits(session(model, Mode.TOKEN_GRAPH, cache=whole), model, ids)
    deferred = stepped_logits(session(model, Mode.TOKEN_GRAPH, 3, cache=whole), model, ids)
    assert np.array_equal(exact.view(np.uint32), deferred.view(np.uint32)), name
    # Layer 1 whole (layer 0 defers nothing: its deferred row would have no wait to order it), layer 2 half: the
    # modes agree bit for bit and the deferring layers move the logits.
    counts = [0, g.n_expert, g.n_expert // 2] + [0] * (g.n_layer - 3)
    cache = expert_cache(model, counts, rng)
    runs = {mode: stepped_logits(session(model, mode, 1, cache=cache), model, ids) for mode in Mode}
    for mode in (Mode.LAYER_GRAPHS, Mode.TOKEN_GRAPH):
        assert np.array_equal(runs[mode], runs[Mode.UNCAPTURED]), (name, mode)
    assert np.all(np.isfinite(runs[Mode.UNCAPTURED])), name
    exact = stepped_logits(session(model, Mode.TOKEN_GRAPH, cache=cache), model, ids)
    assert not np.array_equal(exact, runs[Mode.TOKEN_GRAPH]), name


@pytest.mark.parametrize("defer", [-1, ROUTED])
def test_a_deferral_outside_the_routed_experts_is_refused_with_the_limit(loaded, defer):
    _, model = loaded
    with pytest.raises(InvalidArgument, match=rf"defer_experts must be in 0..{ROUTED - 1} \(below the {ROUTED} "
                                              rf"routed experts of a token\), got {defer}"):
        session(model, Mode.TOKEN_GRAPH, defer)
