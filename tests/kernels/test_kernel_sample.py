"""The GPU sampler (cuda/src/kernels/sample.cu) against the definition, strata.sampling.sample: the same token
for the same logits, parameters, seen ids and uniform draw u. Comparisons are exact (token ids); the float64
sums of the two sides may differ in the last bit, which moves a pick only when u or top_p lies within ~1e-15
of a cumulative-probability boundary: never for random draws, and the crafted boundary cases below are exact
in binary on both sides.
"""

from types import SimpleNamespace

import numpy as np
import pytest

import strata
from support.hooks import native_check as _native_check
from strata.sampling import SamplingParams, sample

pytestmark = pytest.mark.hooks

QWEN_VOCAB = 248320

# Each filter alone, then combined (the last ones as chat front-ends set them).
PARAMS = {
    "temperature": SamplingParams(temperature=0.7),
    "hot": SamplingParams(temperature=1.8),
    "top_k": SamplingParams(temperature=1.0, top_k=20),
    "top_k_1": SamplingParams(temperature=1.0, top_k=1),
    "top_k_over_vocab": SamplingParams(temperature=1.0, top_k=10**6),
    "top_p": SamplingParams(temperature=1.0, top_p=0.9),
    "top_p_tight": SamplingParams(temperature=1.0, top_p=0.2),
    "min_p": SamplingParams(temperature=1.0, min_p=0.05),
    "penalty": SamplingParams(temperature=1.0, repeat_penalty=1.3),
    "penalty_below_1": SamplingParams(temperature=1.0, repeat_penalty=0.8),
    "qwen": SamplingParams(temperature=0.6, top_k=20, top_p=0.95),
    "all": SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.1),
    "all_wide": SamplingParams(temperature=1.2, top_k=5000, top_p=0.97, min_p=0.001, repeat_penalty=1.5),
}


@pytest.fixture
def seed(request, rng):
    """The seed of this test's rng (set up by the rng fixture), for assertion messages."""
    return dict(request.node.user_properties)["seed"]


def reference_tokens(logits, params, draws, seen=()):
    return np.array([sample(logits, params, float(u), seen) for u in draws], np.int32)


def check_same_tokens(logits, params, draws, seen=(), graph=False, seed=None):
    got = _native_check.sample_tokens(logits, params, draws, seen, graph=graph)
    want = reference_tokens(logits, params, draws, seen)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (f"seed={seed} {params} graph={graph}: {bad.size}/{len(draws)} draws differ, first u="
                           f"{draws[bad[0]]!r}: GPU {got[bad[0]]}, reference {want[bad[0]]}")


def random_logits(rng, vocab):
    return (rng.standard_normal(vocab) * rng.uniform(1.0, 4.0)).astype(np.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(PARAMS))
@pytest.mark.parametrize("vocab", [50, 10000])  # 10000: three scan tiles of 4096 with carries between them
def test_each_parameter_alone_and_combined(rng, seed, name, vocab):
    for _ in range(3):
        logits = random_logits(rng, vocab)
        seen = rng.integers(0, vocab, 12)
        check_same_tokens(logits, PARAMS[name], rng.random(40), seen, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["temperature", "qwen", "top_p", "all", "all_wide"])
def test_qwen_vocab(rng, seed, name):
    logits = random_logits(rng, QWEN_VOCAB)
    seen = rng.integers(0, QWEN_VOCAB, 64)
    check_same_tokens(logits, PARAMS[name], rng.random(12), seen, seed=seed)


@pytest.mark.gpu
def test_greedy_is_the_argmax_with_ties_to_the_lower_id(rng, seed):
    logits = random_logits(rng, QWEN_VOCAB)
    top = logits.max() + np.float32(1.0)
    logits[[200000, 70000, 131072]] = top
    got = _native_check.sample_tokens(logits, SamplingParams(), rng.random(3))
    assert got.tolist() == [70000] * 3, f"seed={seed}: greedy gave {got.tolist()}, want 70000"
    check_same_tokens(logits, SamplingParams(), [0.5], seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["temperature", "top_k", "top_p", "min_p", "all"])
def test_exact_ties_follow_the_lower_id(rng, seed, name):
    """Few distinct logit values (and -0.0 beside +0.0): every group of equal logits is ordered by id."""
    logits = rng.integers(-3, 3, 10000).astype(np.float32)
    logits[rng.integers(0, 10000, 2000)] = -0.0
    check_same_tokens(logits, PARAMS[name], rng.random(40), rng.integers(0, 10000, 30), seed=seed)


@pytest.mark.gpu
def test_equal_logits_hit_boundaries_exactly():
    """Eight equal logits: probabilities 1/8 and their sums are exact in binary, so boundaries are sharp.

    u on a boundary goes to the next token (searchsorted side="right"); top_p=0.5 keeps exactly four.
    """
    logits = np.full(8, 0.75, np.float32)
    draws = np.arange(8) / 8.0
    got = _native_check.sample_tokens(logits, SamplingParams(temperature=1.0), draws)
    assert got.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    got = _native_check.sample_tokens(logits, SamplingParams(temperature=1.0, top_p=0.5), draws)
    assert got.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    zeros = np.array([0.0, -0.0, 0.0, -0.0], np.float32)
    got = _native_check.sample_tokens(zeros, SamplingParams(temperature=1.0), [0.0, 0.25, 0.5, 0.75])
    assert got.tolist() == [0, 1, 2, 3]
    for params in (SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_p=0.5)):
        check_same_tokens(logits, params, draws)


@pytest.mark.gpu
def test_repeated_seen_ids_are_penalised_once(rng, seed):
    """2.0 / 1.2 = 1.67 stays above 1.5; penalised twice (1.39) it would fall below."""
    logits = rng.uniform(-1.0, 1.0, 1000).astype(np.float32)
    logits[[10, 20]] = [2.0, 1.5]
    seen = [10, 10, 10, 5, 5, 999]
    greedy = SamplingParams(repeat_penalty=1.2)
    assert _native_check.sample_tokens(logits, greedy, [0.3], seen).tolist() == [10], f"seed={seed}"
    check_same_tokens(logits, greedy, [0.3], seen, seed=seed)

    negative = -rng.uniform(0.5, 1.0, 1000).astype(np.float32)  # all negative: the penalty multiplies
    negative[[3, 4]] = [-0.1, -0.11]
    assert _native_check.sample_tokens(negative, greedy, [0.3], [3, 3]).tolist() == [4], f"seed={seed}"
    for params in (SamplingParams(temperature=0.9, repeat_penalty=1.7), PARAMS["all"]):
        check_same_tokens(logits, params, rng.random(30), rng.integers(0, 1000, 400), seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["temperature", "qwen", "all"])
def test_one_captured_graph_serves_every_draw(rng, seed, name):
    """The sampler captured once; each replay reads new values (u) from device memory."""
    logits = random_logits(rng, 20000)
    check_same_tokens(logits, PARAMS[name], rng.random(40), rng.integers(0, 20000, 50), graph=True, seed=seed)


# The values that pick the argmax whatever u is: the decode step runs them without the sort (sample_argmax).
ARGMAX_PARAMS = {
    "greedy": SamplingParams(),
    "greedy_penalty": SamplingParams(repeat_penalty=1.3),
    "greedy_penalty_below_1": SamplingParams(repeat_penalty=0.8),
    "top_k_1": SamplingParams(temperature=0.9, top_k=1),
    "top_k_1_filters": SamplingParams(temperature=1.5, top_k=1, top_p=0.5, min_p=0.1, repeat_penalty=1.2),
}


def check_argmax_path(logits, params, seen, graph=False, seed=None):
    """The argmax path's token for three draws: the sorted path's and the reference's, exactly."""
    draws = [0.0, 0.5, 0.999]
    fast = _native_check.sample_tokens(logits, params, draws, seen, graph=graph, argmax_path=True)
    by_sort = _native_check.sample_tokens(logits, params, draws, seen, graph=graph)
    want = reference_tokens(logits, params, draws, seen)
    assert fast.tolist() == by_sort.tolist() == want.tolist(), (
        f"seed={seed} {params} graph={graph}: argmax path {fast.tolist()}, sorted {by_sort.tolist()}, "
        f"reference {want.tolist()}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(ARGMAX_PARAMS))
@pytest.mark.parametrize("vocab", [50, 10000, QWEN_VOCAB])  # one CTA of the reduction, several, 122
@pytest.mark.parametrize("graph", [False, True])
def test_argmax_path_picks_what_the_sort_picks(rng, seed, name, vocab, graph):
    for _ in range(2):
        logits = random_logits(rng, vocab)
        seen = rng.integers(0, vocab, 40)
        # A seen id above every other logit: it stays the argmax with the penalty off or below 1, and a penalty
        # above 1.1 may move the argmax to an unseen id.
        logits[seen[0]] = np.float32(1.1) * np.abs(logits).max()
        check_argmax_path(logits, ARGMAX_PARAMS[name], seen, graph=graph, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["greedy", "greedy_penalty", "top_k_1"])
def test_argmax_path_ties_go_to_the_lower_id(rng, seed, name):
    """Few distinct values, -0.0 beside +0.0; and a maximum of 0 held by zeros of both signs."""
    logits = rng.integers(-3, 3, QWEN_VOCAB).astype(np.float32)
    logits[rng.integers(0, QWEN_VOCAB, 2000)] = -0.0
    check_argmax_path(logits, ARGMAX_PARAMS[name], rng.integers(0, QWEN_VOCAB, 30), seed=seed)
    zeros = -rng.uniform(0.5, 1.0, 10000).astype(np.float32)
    zeros[[9000, 7, 3]] = [0.0, -0.0, 0.0]
    got = _native_check.sample_tokens(zeros, ARGMAX_PARAMS[name], [0.5], argmax_path=True)
    assert got.tolist() == [3], f"seed={seed}: the argmax path gave {got.tolist()}, want 3"
    check_argmax_path(zeros, ARGMAX_PARAMS[name], [], seed=seed)


@pytest.mark.gpu
def test_argmax_path_penalises_repeated_ids_once(rng, seed):
    """2.0 / 1.2 = 1.67 stays above 1.5; penalised twice (1.39) it would fall below."""
    logits = rng.uniform(-1.0, 1.0, 1000).astype(np.float32)
    logits[[10, 20]] = [2.0, 1.5]
    greedy = SamplingParams(repeat_penalty=1.2)
    got = _native_check.sample_tokens(logits, greedy, [0.3], [10, 10, 10, 5, 5, 999], argmax_path=True)
    assert got.tolist() == [10], f"seed={seed}"


def test_argmax_path_refuses_values_that_draw():
    params = SimpleNamespace(temperature=0.7, top_k=2, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
    with pytest.raises(strata.InvalidArgument, match="argmax path needs temperature 0 or top_k 1"):
        _native_check.sample_tokens(np.ones(10, np.float32), params, [0.5], argmax_path=True)


# Argument checks happen before any device work, so these run without a GPU.
GOOD = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"temperature": -1.0}, "temperature must be >= 0"),
        ({"temperature": float("nan")}, "must be finite"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"min_p": 1.0}, r"min_p must be in \[0, 1\)"),
        ({"repeat_penalty": 0.0}, "repeat_penalty must be > 0"),
    ],
)
def test_bad_parameters_are_refused_as_the_reference_refuses_them(change, fragment):
    params = SimpleNamespace(**{**GOOD, **change})
    with pytest.raises(strata.InvalidArgument, match=fragment):
        _native_check.sample_tokens(np.ones(10, np.float32), params, [0.5])


@pytest.mark.parametrize(
    ("logits", "draws", "seen", "fragment"),
    [
        (np.ones(10, np.float32), [0.5, 1.0], (), r"uniform draw must be in \[0, 1\), got 1\.0+ \(draw 1\)"),
        (np.ones(10, np.float32), [-0.1], (), r"uniform draw must be in \[0, 1\)"),
        (np.ones(10, np.float32), [], (), "at least one draw"),
        (np.ones(10, np.float32), [0.5], (3, 10), r"seen id 10 \(entry 1\) is outside the vocab \[0, 10\)"),
        (np.ones(10, np.float32), [0.5], (-1,), "seen id -1"),
        (np.array([0.0, np.nan], np.float32), [0.5], (), r"NaN or infinity \(index 1\)"),
        (np.zeros(0, np.float32), [0.5], (), r"vocab must be in \[1, 262144\], got 0"),
        (np.ones(262145, np.float32), [0.5], (), r"vocab must be in \[1, 262144\], got 262145"),
    ],
)
def test_bad_inputs_are_refused(logits, draws, seen, fragment):
    with pytest.raises(strata.InvalidArgument, match=fragment):
        _native_check.sample_tokens(logits, SimpleNamespace(**GOOD), draws, seen)


def test_a_penalty_that_overflows_a_logit_is_refused():
    logits = np.array([1.0, -3e38], np.float32)
    params = SimpleNamespace(**{**GOOD, "repeat_penalty": 10.0})
    with pytest.raises(strata.InvalidArgument, match=r"after the repetition penalty \(id 1\)"):
        _native_check.sample_tokens(logits, params, [0.5], [1])
