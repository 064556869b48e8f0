"""The decode session on the GPU: every layer composed, checked token by token against the numpy reference
(activation_quant=True, the same q8_32 activation contract), in all three modes."""

import dataclasses

import numpy as np
import pytest

from strata import _native
from strata.errors import InvalidArgument
from strata.options import Mode
from strata.runtime.expert_cache import cache_bytes
from strata.runtime.model import load
from strata.runtime.plan import file_tensors
from strata.reference import Reference
from strata.runtime.ple_rows import NATIVE_ROW_TYPES, PleRows
from strata.sampling import SamplingParams, log_probabilities, sample
from support.compare import relative_errors
from support.native_session import GREEDY, open_native_session, ple_rows, stepped_logits

pytestmark = pytest.mark.gpu

QUANT = {"experts": "q4_k", "expert_down": "q4_0", "dense": "q8_0", "embeddings": "q8_0", "ple": "q8_0"}
# Everything on the GPU float32; the experts q8_0 on the CPU pool, or bf16 (float32 x and h there, as in the
# reference: the float tolerances hold).
FLOAT = {"experts": "q8_0", "expert_down": "q8_0", "dense": "f32", "embeddings": "f32", "ple": "f32"}
BF16_EXPERTS = FLOAT | {"experts": "bf16", "expert_down": "bf16"}
CASES = {"qwen4exp-f32": ("qwen4exp", FLOAT), "qwen4exp-quant": ("qwen4exp", QUANT),
         "qwen3next-quant": ("qwen3next", QUANT), "qwen35moe-f32": ("qwen35moe", FLOAT),
         "qwen3next-bf16experts": ("qwen3next", BF16_EXPERTS)}
# max|logit diff| / max|logit| against the reference, per step. The GPU and numpy agree on every integer inner
# sum; what differs is float32 summation order (GEMV rows, norms, softmax), the KV cache's rounding (bf16: 8
# mantissa bits; int8: 1/254 of each 32-group's range) and, where x is requantized to q8_32 before every
# quantized weight, the codes those tiny differences flip. Measured on the box: float dense 1e-4..4e-3 per
# step (bf16) and up to 9e-3 (int8); q8_0 dense 2e-3..1.1e-2. A near-tie in a router's top-k or a QSA block
# choice can flip one discrete decision on one side, which moves that step's logits by several 1e-2 (0.22 once,
# qwen35moe f32 int8, 2026-12-01) and, through the recurrent state, later steps' by less (test_decode_transformers
# saw 0.09 on every step after an early flip): the median bounds the systematic error, the 90th percentile
# what reaches many steps, and no step may be garbage (a wrong kernel moves the logits by their own size).
MEDIAN = {("float", "bf16"): 4e-3, ("float", "int8"): 1e-2, ("quant", "bf16"): 1.5e-2, ("quant", "int8"): 2e-2}
STEADY = 0.15  # the 90th percentile's bound
GARBAGE = 1.0


@pytest.fixture(scope="module", params=sorted(CASES))
def loaded(request, tiny_model):
    arch, types = CASES[request.param]
    # the pool answers every routed expert; caches are built below
    model = load(tiny_model(arch, types=types, seed=11), progress=False, expert_cache=0)
    yield request.param, model
    model.close()


def session(model, mode, kv="bf16", context=256, snapshots=0, cache=None, ple=None):
    return open_native_session(model, context=context, kv=kv, mode=mode, snapshots=snapshots, cache=cache, ple=ple)


def decode(native, model, prompt, steps, reference=None):
    """Feed the prompt, then `steps` tokens the GPU picks greedily; returns (tokens, GPU logits, reference
    logits), the reference's only when it is given (it then runs every token too)."""
    ple = ple_rows(model)
    tokens, gpu, ref = [], [], []
    token = None
    feed = list(prompt)
    while len(gpu) < len(prompt) + steps:
        t = feed.pop(0) if feed else token
        token = native.step(int(t), ple(t), GREEDY, 0.0)
        tokens.append(token)
        gpu.append(native.logits())
        if reference is not None:
            ref.append(reference.forward([t])[-1])
    return tokens, np.array(gpu), np.array(ref)


@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_decode_matches_the_reference_token_by_token(loaded, kv, rng):
    name, model = loaded
    prompt = rng.integers(0, model.info.geometry.n_vocab, 8)
    reference = Reference(model.file, activation_quant=True)
    native = session(model, Mode.UNCAPTURED, kv)
    tokens, gpu, ref = decode(native, model, prompt, 56, reference)
    assert np.all(np.isfinite(gpu)), name
    errors = relative_errors(gpu, ref)
    dense = "quant" if name.endswith("quant") else "float"
    print(f"{name} kv={kv}: max|diff|/max|logit| median {np.median(errors):.2e}, worst {errors.max():.2e}")
    assert np.median(errors) < MEDIAN[dense, kv], (name, kv, errors)
    assert np.quantile(errors, 0.9) < STEADY, (name, kv, errors)
    assert errors.max() < GARBAGE, (name, kv, errors)
    assert tokens == [int(np.argmax(g)) for g in gpu]  # greedy picks the GPU logits' argmax
    assert native.position == 64


def test_three_modes_give_identical_logits_and_reset_repeats(loaded, rng):
    name, model = loaded
    prompt = rng.integers(0, model.info.geometry.n_vocab, 5)
    runs = {}
    for mode in Mode:
        native = session(model, mode)
        runs[mode] = decode(native, model, prompt, 20)[:2]
        if mode is not Mode.UNCAPTURED:
            assert native.captured
        native.reset()
        assert native.position == 0
        again = decode(native, model, prompt, 20)[:2]
        assert again[0] == runs[mode][0], (name, mode)
        assert np.array_equal(again[1], runs[mode][1]), (name, mode)
    for mode in (Mode.LAYER_GRAPHS, Mode.TOKEN_GRAPH):
        assert runs[mode][0] == runs[Mode.UNCAPTURED][0], (name, mode)
        assert np.array_equal(runs[mode][1], runs[Mode.UNCAPTURED][1]), (name, mode)


def test_sampling_follows_the_definition_with_every_token_seen(loaded, rng):
    name, model = loaded
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.02, repeat_penalty=1.3)
    native = session(model, Mode.TOKEN_GRAPH)
    ple = ple_rows(model)
    seen, token = [], int(rng.integers(0, model.info.geometry.n_vocab))
    for _ in range(24):
        u = float(rng.random())
        seen.append(token)
        got = native.step(token, ple(token), (params.temperature, params.top_k, params.top_p,
                                                                params.min_p, params.repeat_penalty), u)
        assert got == sample(native.logits(), params, u, seen), (name, len(seen))
        token = got


def test_bad_steps_are_refused_with_the_limit(loaded):
    name, model = loaded
    g = model.info.geometry
    native = session(model, Mode.UNCAPTURED, context=3)
    ple = ple_rows(model)
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        native.step(g.n_vocab, ple(0), GREEDY, 0.0)
    if g.ple_layers:
        with pytest.raises(InvalidArgument, match="PLE"):
            native.step(1, None, GREEDY, 0.0)
    for t in range(3):
        native.step(t, ple(t), GREEDY, 0.0)
    with pytest.raises(InvalidArgument, match="sequence is full"):
        native.step(1, ple(1), GREEDY, 0.0)
    native.reset()
    assert native.position == 0


def fresh_logits(model, ids) -> np.ndarray:
    """The logits after `ids` fed one by one to a new native session (no snapshot ever taken)."""
    native = session(model, Mode.TOKEN_GRAPH)
    ple = ple_rows(model)
    for t in ids:
        native.step(int(t), ple(int(t)), GREEDY, 0.0, sample=False)
    return native.logits()


def test_a_conversation_reuses_its_prefix_and_a_restored_snapshot_continues_bit_for_bit(loaded, rng):
    name, model = loaded
    g = model.info.geometry
    eos = set(model.tokenizer.eos_ids) | ({g.ple_eos} if g.ple_layers else set())

    def ids(n):
        return [int(t) for t in rng.integers(0, g.n_vocab, 4 * n) if int(t) not in eos][:n]

    # Token by token (prompt_chunk=0): the fresh session steps every id, and the prompt path's tensor-core
    # products round differently from the GEMVs (tests/session/test_prompt_path.py bounds that difference).
    chat = model.session(context=256, kv="bf16", snapshots=2, prompt_chunk=0)
    try:
        first = ids(9)
        chat.complete(first, max_tokens=4)
        answered = chat.tokens[len(first)]  # the first token of the answer (its EOS, if it said nothing)
        assert np.array_equal(chat.engine.logits(), fresh_logits(model, chat.tokens[:-1])), name
        longer = chat.tokens + ids(5)  # the conversation continues: only the new turn is fed
        done = chat.complete(longer, max_tokens=3)
        assert done.usage.cached_tokens == len(longer) - 6, (name, done.usage)
        assert np.array_equal(chat.engine.logits(), fresh_logits(model, chat.tokens[:-1])), name
        edited = first + [answered ^ 1] + ids(4)  # diverges after the first prompt: back to its last token
        done = chat.complete(edited, max_tokens=3)
        assert done.usage.cached_tokens == len(first) - 1, (name, done.usage)
        assert np.array_equal(chat.engine.logits(), fresh_logits(model, chat.tokens[:-1])), name
        done = chat.complete(edited, max_tokens=2)  # a retry of the same prompt feeds one token
        assert done.usage.cached_tokens == len(edited) - 1, (name, done.usage)
        assert np.array_equal(chat.engine.logits(), fresh_logits(model, chat.tokens[:-1])), name
    finally:
        chat.close()


def test_device_logprobs_follow_the_definition(loaded, rng):
    name, model = loaded
    native = session(model, Mode.TOKEN_GRAPH)
    ple = ple_rows(model)
    token = int(rng.integers(0, model.info.geometry.n_vocab))
    for _ in range(5):
        token = native.step(token, ple(token), GREEDY, 0.0)
        got = native.logprobs(token, 5)
        want = log_probabilities(native.logits(), token, 5)
        # the same float32 logits on both sides, exp and log in float64: rounding of the sum's order only
        assert got[0] == pytest.approx(want[0], abs=1e-9), name
        assert [i for i, _ in got[1]] == [i for i, _ in want[1]], name
        assert np.allclose([v for _, v in got[1]], [v for _, v in want[1]], rtol=0, atol=1e-9), name
    with pytest.raises(InvalidArgument, match="n must be in 0..20"):
        native.logprobs(token, 21)


def test_snapshot_slots_are_checked(loaded):
    name, model = loaded
    native = session(model, Mode.UNCAPTURED)
    with pytest.raises(InvalidArgument, match="holds no snapshot"):
        native.restore(0)
    with pytest.raises(InvalidArgument, match="outside the session's 0 slots"):
        native.snapshot(0)


# --- routed experts in the VRAM expert cache (strata/expert_cache.hpp) ---

# Replacement at its busiest: every miss admitted, copies unbounded (the tiny models' 8 experts churn each token).
CHURN = {"replace": True, "admit_after": 1, "window": 4, "max_copies": 1000}


def expert_cache(model, rng, share, policy=None):
    """A cache holding `share` of every layer's experts, a random choice of them in a random slot order."""
    g = model.info.geometry
    count = max(1, round(share * g.n_expert))
    cache = _native.ExpertCache(model.pool.native, [count] * g.n_layer, 0, policy,
                                host_weights=model.pool.host_weights())
    for layer in range(g.n_layer):
        cache.hold(layer, rng.permutation(g.n_expert)[:count])
    return cache


def own_logits(native, ids):
    """The logits after each of `ids` fed one by one to a session that gathers its PLE rows itself."""
    out = []
    for t in ids:
        native.step(int(t), None, GREEDY, 0.0, sample=False)
        out.append(native.logits())
    return np.array(out)


@pytest.mark.parametrize("held", ["none", "below the PLE layer", "all"])
def test_the_sessions_own_ple_gather_gives_the_callers_logits_bit_for_bit(loaded, held, rng):
    """The session's own gather (after the launch where a layer below the PLE layer rings, copied up at the PLE
    layer; before the launch where the cache holds every layer below whole) against rows passed in, in every
    mode; reset and a restored snapshot bring its n-gram state back with the session's."""
    name, model = loaded
    g = model.info.geometry
    if not g.ple_layers:
        pytest.skip(f"{name} has no PLE layer")
    cache = None
    if held != "none":
        whole = g.n_layer if held == "all" else g.ple_layers[0]
        cache = _native.ExpertCache(model.pool.native, [g.n_expert] * whole + [0] * (g.n_layer - whole), 0, None,
                                    host_weights=model.pool.host_weights())
        for layer in range(whole):
            cache.hold(layer, rng.permutation(g.n_expert))
    ids = [int(t) for t in rng.integers(0, g.n_vocab, 14)]
    ids[4] = ids[5] = g.ple_eos  # two EOS in a row cut the n-gram context
    for mode in Mode:
        want = stepped_logits(session(model, mode, cache=cache), model, ids)
        gather = PleRows(model.file, g).native()
        assert gather is not None, name  # the synth tables are f32 or q8_0
        own = session(model, mode, snapshots=1, cache=cache, ple=gather)
        got = own_logits(own, ids[:8])
        own.snapshot(0)
        own_logits(own, ids[:6])  # a detour the restore forgets
        own.restore(0)
        got = np.concatenate([got, own_logits(own, ids[8:])])
        assert np.array_equal(got, want), (name, held, mode)
        assert own.stats()["ple_seconds"] > 0.0
        own.reset()
        assert np.array_equal(own_logits(own, ids), want), (name, held, mode)
        with pytest.raises(InvalidArgument, match="gathers the PLE rows itself"):
            own.step(1, PleRows(model.file, g).rows(1), GREEDY, 0.0)
    rows, shape = PleRows(model.file, g), g.ple
    two_heads = dataclasses.replace(shape, heads_per_ngram=1, head_sizes=shape.head_sizes[:2],
                                    head_offsets=shape.head_offsets[:2])
    narrow = _native.PleGather(rows.table, NATIVE_ROW_TYPES[rows.ggml_type], two_heads)
    with pytest.raises(InvalidArgument, match=f"the PLE gather reads 2 rows of {shape.head_dim} values per token"):
        session(model, Mode.UNCAPTURED, ple=narrow)


@pytest.mark.parametrize("share", [1.0, 0.5])
def test_cached_experts_match_the_reference_token_by_token(loaded, share, rng):
    name, model = loaded
    prompt = rng.integers(0, model.info.geometry.n_vocab, 8)
    cache = expert_cache(model, rng, share)
    native = session(model, Mode.TOKEN_GRAPH, "bf16", cache=cache)
    tokens, gpu, ref = decode(native, model, prompt, 56, Reference(model.file, activation_quant=True))
    assert np.all(np.isfinite(gpu)), name
    errors = relative_errors(gpu, ref)
    dense = "quant" if name.endswith("quant") else "float"
    print(f"{name} cache {share:.0%}: max|diff|/max|logit| median {np.median(errors):.2e}, worst {errors.max():.2e}")
    assert np.median(errors) < MEDIAN[dense, "bf16"], (name, share, errors)
    assert np.quantile(errors, 0.9) < STEADY, (name, share, errors)
    assert errors.max() < GARBAGE, (name, share, errors)
    stats = native.stats()
    g = model.info.geometry
    routed = g.n_expert_used * 64
    assert [h + m for h, m in zip(stats["expert_hits"], stats["expert_misses"])] == [routed] * g.n_layer, name
    if share == 1.0:  # no layer rings: the GPU alone
        assert stats["rings"] == 0 and sum(stats["expert_misses"]) == 0, (name, stats)
    else:  # every layer rings every token, whether or not the pool has work in it
        assert stats["rings"] == 64 * g.n_layer, (name, stats["rings"])


# Where an expert runs changes only float summation order (the pool sums its rows on the host, the GPU its own)
# and, where that moves a hidden value across a q8_32 rounding edge, one code of it. With float dense weights the
# logits after the first token then agree to ~1e-5 of their size. Quantized dense weights requantize x before
# every GEMV, and any difference flips a few codes by 1/127 of their block's range each time: the box measured
# 5.6e-3 after the first token (qwen4exp q8_0, 2026-12-01), as large as the GPU's distance from the reference.
# Later steps carry such differences through the recurrent state; the reference's medians bound them. With float
# dense weights one flipped code of an expert's input still moves a step's logits by ~1e-3 of their size (the box:
# 1.17e-3, qwen35moe f32, every expert cached, 2026-12-06), so the first step is bounded above that, far under
# the ~1e-1 of an expert computed wrongly.
FIRST_STEP = {"float": 4e-3, "quant": MEDIAN["quant", "bf16"]}


def test_where_an_expert_runs_moves_the_logits_only_by_rounding(loaded, rng):
    name, model = loaded
    dense = "quant" if name.endswith("quant") else "float"
    ids = rng.integers(0, model.info.geometry.n_vocab, 12)
    pool = stepped_logits(session(model, Mode.TOKEN_GRAPH), model, ids)
    for share in (1.0, 0.5, 0.25):
        cached = stepped_logits(session(model, Mode.TOKEN_GRAPH, cache=expert_cache(model, rng, share)), model, ids)
        assert np.all(np.isfinite(cached)), (name, share)
        errors = relative_errors(cached, pool)
        assert errors[0] < FIRST_STEP[dense], (name, share, errors)
        assert np.median(errors) < MEDIAN[dense, "bf16"], (name, share, errors)


def test_three_modes_give_identical_logits_with_a_partial_cache(loaded, rng):
    name, model = loaded
    ids = rng.integers(0, model.info.geometry.n_vocab, 10)
    cache = expert_cache(model, rng, 0.5)
    runs = {mode: stepped_logits(session(model, mode, cache=cache), model, ids) for mode in Mode}
    for mode in (Mode.LAYER_GRAPHS, Mode.TOKEN_GRAPH):
        assert np.array_equal(runs[mode], runs[Mode.UNCAPTURED]), (name, mode)


def test_an_expert_cache_refuses_what_it_cannot_hold(loaded):
    name, model = loaded
    g = model.info.geometry
    with pytest.raises(InvalidArgument, match=f"layer 0 slots must be in 0..{g.n_expert}"):
        _native.ExpertCache(model.pool.native, [g.n_expert + 1] * g.n_layer, 0, host_weights=None)
    with pytest.raises(InvalidArgument, match=f"slots for {g.n_layer + 1} layers"):
        _native.ExpertCache(model.pool.native, [1] * (g.n_layer + 1), 0, host_weights=None)
    cache = _native.ExpertCache(model.pool.native, [2] * g.n_layer, 0, host_weights=model.pool.host_weights())
    with pytest.raises(InvalidArgument, match="layer 1 has 2 slots, asked to hold 3"):
        cache.hold(1, [0, 1, 2])
    with pytest.raises(InvalidArgument, match="expert 3 asked for twice"):
        cache.hold(0, [3, 3])
    with pytest.raises(InvalidArgument, match=f"expert {g.n_expert} is outside"):
        cache.hold(0, [g.n_expert])
    cache.hold(0, [5, 2])
    assert cache.held(0) == [5, 2] and cache.holds(0, 2) and not cache.holds(0, 0) and not cache.holds_all(0)
    assert cache.held(1) == [-1, -1]
    assert cache.bytes == _native.ExpertCache.bytes_for(model.pool.native, [2] * g.n_layer)


def test_a_loaded_model_places_its_experts_by_budget(loaded):
    name, model = loaded
    g = model.info.geometry
    with load(model.file.path, progress=False) as auto:  # a tiny model fits whole
        assert auto.cache_slots == [g.n_expert] * g.n_layer
        assert all(auto.cache.holds_all(layer) for layer in range(g.n_layer))
        chat = auto.session(context=64, kv="bf16")
        try:
            chat.complete([1, 2, 3], max_tokens=4)
            stats = chat.engine_stats
        finally:
            chat.close()
        assert stats["rings"] == 0 and sum(stats["expert_hits"]) > 0, (name, stats)
    one_expert = cache_bytes(model.pool, [1] * g.n_layer)  # the native cache's figure
    with load(model.file.path, progress=False, expert_cache=one_expert) as part:
        assert part.cache_slots == [1] * g.n_layer, part.cache_slots
        assert part.cache.bytes == one_expert
        assert [part.cache.held(layer) for layer in range(g.n_layer)] == [[0]] * g.n_layer


def test_replacement_moves_experts_without_moving_the_logits(loaded, rng):
    name, model = loaded
    g = model.info.geometry
    dense = "quant" if name.endswith("quant") else "float"
    ids = rng.integers(0, g.n_vocab, 24)
    pool = stepped_logits(session(model, Mode.TOKEN_GRAPH), model, ids)
    start = int(rng.integers(1 << 30))
    runs = {}
    for mode in Mode:  # each with a fresh cache of the same start: the copies land one token later, always
        cache = expert_cache(model, np.random.default_rng(start), 0.5, CHURN)
        first = [cache.held(layer) for layer in range(g.n_layer)]
        native = session(model, mode, cache=cache)
        runs[mode] = stepped_logits(native, model, ids)
        stats = native.stats()
        assert sum(stats["expert_copies"]) > 0 and stats["expert_copy_bytes"] > 0, (name, mode, stats)
        moved = [cache.held(layer) for layer in range(g.n_layer)]
        assert moved != first, name
        for held in moved:  # every slot full again or filling, never one expert twice
            assert len({e for e in held if e >= 0}) == len([e for e in held if e >= 0]), (name, held)
    for mode in (Mode.LAYER_GRAPHS, Mode.TOKEN_GRAPH):
        assert np.array_equal(runs[mode], runs[Mode.UNCAPTURED]), (name, mode)
    errors = relative_errors(runs[Mode.TOKEN_GRAPH], pool)
    assert np.all(np.isfinite(runs[Mode.TOKEN_GRAPH])), name
    assert errors[0] < FIRST_STEP[dense] and np.median(errors) < MEDIAN[dense, "bf16"], (name, errors)


def test_replacement_decodes_as_the_reference_does(loaded, rng):
    name, model = loaded
    prompt = rng.integers(0, model.info.geometry.n_vocab, 8)
    native = session(model, Mode.TOKEN_GRAPH, "bf16", cache=expert_cache(model, rng, 0.25, CHURN))
    _, gpu, ref = decode(native, model, prompt, 40, Reference(model.file, activation_quant=True))
    errors = relative_errors(gpu, ref)
    dense = "quant" if name.endswith("quant") else "float"
    assert np.all(np.isfinite(gpu)), name
    assert np.median(errors) < MEDIAN[dense, "bf16"] and np.quantile(errors, 0.9) < STEADY, (name, errors)
    assert errors.max() < GARBAGE, (name, errors)
