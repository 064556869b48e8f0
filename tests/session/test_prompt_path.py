"""The prompt path on the GPU (docs/prompt.md): a prompt fed in chunks leaves the state that feeding it token by
token leaves, so the logits at its last token and every token decoded after it match the decode path's, for
all three architectures, chunks that end inside a QSA block and inside an n-gram, EOS inside a prompt, routed
experts from the staging (copied per chunk, or the whole layer ahead), from the VRAM cache, or both."""

import numpy as np
import pytest

from strata import _native
from strata.errors import InvalidArgument
from strata.options import Mode
from strata.reference import Reference
from strata.runtime.model import load
from strata.runtime.ple_rows import PleRows

from support.compare import relative_errors
from support.native_session import open_native_session
from test_decode_session import CASES, GARBAGE, GREEDY, MEDIAN, STEADY

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", params=sorted(CASES))
def loaded(request, tiny_model):
    arch, types = CASES[request.param]
    # Staging and caches are built per test; prompt=True sizes the pool's rows for its share of small chunks.
    model = load(tiny_model(arch, types=types, seed=11), progress=False, expert_cache=0, prompt=True)
    yield request.param, model
    model.close()


def staging(model, slots=None):
    g = model.info.geometry
    return _native.ExpertStaging(model.pool.native, slots or g.n_expert, 0, host_weights=model.pool.host_weights())


def session(model, chunk, staged=None, cache=None, kv="bf16", mode=Mode.TOKEN_GRAPH, cpu=True):
    return open_native_session(model, context=256, kv=kv, mode=mode, prompt_chunk=chunk, staging=staged, cache=cache,
                               prompt_cpu=cpu)


def prompt_ids(model, rng, n):
    """Random ids with the PLE EOS at a few places inside (its n-gram resets there)."""
    g = model.info.geometry
    ids = rng.integers(0, g.n_vocab, n)
    if g.ple_layers:
        ids[[5, 6, n // 2]] = g.ple_eos
    return [int(t) for t in ids]


def rows_of(model):
    g = model.info.geometry
    return PleRows(model.file, g) if g.ple_layers else None


def feed_prompt(native, model, prompt):
    ple = rows_of(model)
    token = native.feed(prompt, ple.rows_for(prompt) if ple else None, GREEDY, 0.0)
    return token, native.logits(), ple


def step_prompt(native, model, prompt):
    ple = rows_of(model)
    token = None
    for t in prompt:
        token = native.step(t, ple.rows(t) if ple else None, GREEDY, 0.0)
    return token, native.logits(), ple


def continue_with(native, ple, tokens):
    """Step `tokens` (the same ids into both sessions: each one's own greedy picks could part at a near-tie)."""
    logits = []
    for t in tokens:
        native.step(t, ple.rows(t) if ple else None, GREEDY, 0.0)
        logits.append(native.logits())
    return logits


def bounds(name, kv):
    """The decode tests' bounds (test_decode_session.MEDIAN): the quantized class wherever x is requantized to
    q8_32 for quantized weights, the routed experts included. The prompt path's products sum in another order
    than the GEMV's, and a last-bit difference in x can flip a q8_32 code there, as the decode tests say of the
    reference."""
    quantized_experts = CASES[name][1]["experts"] not in ("f32", "f16", "bf16")
    return MEDIAN["quant" if name.endswith("quant") or quantized_experts else "float", kv]


@pytest.mark.parametrize("chunk", [7, 32])  # on-demand fills (7 * k < 2 * experts); the whole layer ahead
@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_prompt_in_chunks_matches_token_by_token(loaded, chunk, kv, rng):
    name, model = loaded
    prompt = prompt_ids(model, rng, 45)
    staged = staging(model)
    chunked = session(model, chunk, staged, kv=kv)
    stepped = session(model, 0, kv=kv)
    t_chunk, l_chunk, ple_c = feed_prompt(chunked, model, prompt)
    t_step, l_step, ple_s = step_prompt(stepped, model, prompt)
    assert chunked.position == stepped.position == len(prompt)
    assert np.all(np.isfinite(l_chunk)), name
    stats = chunked.stats()
    assert stats["prompt_tokens"] == 45 and stats["prompt_chunks"] == -(-45 // chunk)
    assert stats["prompt_staged_experts"] > 0 and stats["prompt_staged_bytes"] > 0
    # The next tokens decode from the prompt's state: fed the same ids, both sessions must agree throughout.
    then = [t_step, *(int(t) for t in rng.integers(0, model.info.geometry.n_vocab, 11))]
    after_c = continue_with(chunked, ple_c, then)
    after_s = continue_with(stepped, ple_s, then)
    errors = relative_errors([l_chunk, *after_c], [l_step, *after_s])
    print(f"{name} kv={kv} chunk={chunk}: prompt logits vs token by token {errors[0]:.2e}, after: median "
          f"{np.median(errors[1:]):.2e}, worst {errors.max():.2e}")
    assert np.median(errors) < bounds(name, kv), (name, errors)
    assert np.quantile(errors, 0.9) < STEADY, (name, errors)
    assert errors.max() < GARBAGE, (name, errors)


def test_every_positions_logits_match_stepping(loaded, rng):
    name, model = loaded
    g = model.info.geometry
    prompt = prompt_ids(model, rng, 30)
    chunked = session(model, 8, staging(model))
    ple = rows_of(model)
    every = np.full((len(prompt), g.n_vocab), np.nan, dtype=np.float32)  # poisoned: every row must be written
    chunked.feed(prompt, ple.rows_for(prompt) if ple else None, GREEDY, 0.0, sample=False, logits=every)
    last = chunked.logits()
    stepped = session(model, 0)
    ple = rows_of(model)
    per_step = []
    for t in prompt:
        stepped.step(t, ple.rows(t) if ple else None, GREEDY, 0.0, sample=False)
        per_step.append(stepped.logits())
    assert np.all(np.isfinite(every)), name
    # The last row is the logits the feed leaves, up to the summation order of the head's product over the rows
    # against decode's one-row GEMV.
    assert np.max(np.abs(every[-1] - last)) <= 1e-5 * np.max(np.abs(last)), name
    errors = relative_errors(list(every), per_step)
    assert np.median(errors) < bounds(name, "bf16") and errors.max() < GARBAGE, (name, errors)


def test_prompt_matches_the_reference(loaded, rng):
    name, model = loaded
    prompt = prompt_ids(model, rng, 40)
    chunked = session(model, 16, staging(model))
    _, logits, _ = feed_prompt(chunked, model, prompt)
    reference = Reference(model.file, activation_quant=True)
    ref = reference.forward(prompt)[-1]
    error = relative_errors([logits], [ref])[0]
    print(f"{name}: prompt path vs reference at the last prompt token {error:.2e}")
    assert error < max(4 * bounds(name, "bf16"), 0.05), (name, error)


def test_cached_experts_are_used_in_place(loaded, rng):
    name, model = loaded
    g = model.info.geometry
    prompt = prompt_ids(model, rng, 30)
    moe = [g.n_expert] * g.n_layer
    whole = _native.ExpertCache(model.pool.native, moe, 0, {}, host_weights=model.pool.host_weights())
    for layer in range(g.n_layer):
        whole.hold(layer, list(range(g.n_expert)))
    half = _native.ExpertCache(model.pool.native, [g.n_expert // 2] * g.n_layer, 0, {},
                               host_weights=model.pool.host_weights())
    for layer in range(g.n_layer):
        half.hold(layer, list(range(0, g.n_expert, 2)))
    # Without the pool's share, every expert runs on the GPU from the same bytes: the same products where the host
    # groups them (the staging's, the cache's, or both).
    reference_logits = feed_prompt(session(model, 8, staging(model), cpu=False), model, prompt)[1]
    mixed = session(model, 8, staging(model), cache=half, cpu=False)
    _, l_mixed, _ = feed_prompt(mixed, model, prompt)
    st = mixed.stats()
    assert st["prompt_cached_experts"] > 0 and st["prompt_staged_experts"] > 0
    assert relative_errors([l_mixed], [reference_logits])[0] < 1e-5, name
    # With every expert cached, a chunk of at most 64 rows runs its (row, expert) pairs as the decode GEMVs, in
    # place, routed on the device: nothing staged or grouped; the other order of the same sums, within the bound
    # of the prompt path against stepping.
    all_cached = session(model, 8, cache=whole, cpu=False)  # no staging needed: every expert is in VRAM
    _, l_all, _ = feed_prompt(all_cached, model, prompt)
    st = all_cached.stats()
    assert st["prompt_staged_experts"] == st["prompt_cached_experts"] == st["prompt_pooled_experts"] == 0
    error = relative_errors([l_all], [reference_logits])[0]
    assert error < 4 * bounds(name, "bf16"), (name, error)


def test_the_pool_takes_a_share_of_a_small_chunks_experts(loaded, rng):
    name, model = loaded
    prompt = prompt_ids(model, rng, 21)  # chunks of 7: 14 routed rows, fewer than twice the 8 experts
    staged = staging(model)
    shared = session(model, 7, staged)
    alone = session(model, 7, staged, cpu=False)
    stepped = session(model, 0)
    logits = {}
    for key, native in (("shared", shared), ("alone", alone), ("stepped", stepped)):
        logits[key] = (step_prompt if key == "stepped" else feed_prompt)(native, model, prompt)[1]
    assert shared.stats()["prompt_pooled_experts"] > 0 and alone.stats()["prompt_pooled_experts"] == 0
    assert shared.stats()["prompt_staged_experts"] < alone.stats()["prompt_staged_experts"]
    for key in ("shared", "alone"):
        error = relative_errors([logits[key]], [logits["stepped"]])[0]
        assert error < 4 * bounds(name, "bf16"), (name, key, error)


def test_small_staging_fills_several_times_per_layer(loaded, rng):
    name, model = loaded
    prompt = prompt_ids(model, rng, 24)
    full = feed_prompt(session(model, 24, staging(model), cpu=False), model, prompt)[1]
    small = session(model, 24, staging(model, slots=3), cpu=False)
    got = feed_prompt(small, model, prompt)[1]
    assert relative_errors([got], [full])[0] < 1e-5, name


def test_refusals(loaded):
    name, model = loaded
    ple = rows_of(model)

    def rows(ids):
        return PleRows(model.file, model.info.geometry).rows_for(ids) if ple else None

    with pytest.raises(InvalidArgument, match="no prompt path"):
        session(model, 0).feed([1, 2, 3], rows([1, 2, 3]), GREEDY, 0.0)
    with pytest.raises(InvalidArgument, match="needs the expert staging"):  # neither staging nor a whole cache
        session(model, 8).feed([1, 2, 3], rows([1, 2, 3]), GREEDY, 0.0)
    with pytest.raises(InvalidArgument, match="prompt chunk must be"):
        session(model, 9000, staging(model))
    with pytest.raises(InvalidArgument, match="sequence is full"):
        session(model, 8, staging(model)).feed([1] * 257, rows([1] * 257), GREEDY, 0.0)
