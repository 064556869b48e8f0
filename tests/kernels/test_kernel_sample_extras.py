"""The GPU sampler's logit bias, frequency and presence penalties and token mask (issues 46, 48) against the
definition, strata.sampling.sample: the same token for the same logits, parameters, seen ids and draw, exactly, on
fresh random logits. The hook also checks that the answer's counts buffer is all zero again after every run (the
sampler's invariant between draws)."""

import numpy as np
import pytest

import strata
from support.hooks import native_check as _native_check
from strata.sampling import SamplingParams, TokenMask, sample
from test_kernel_sample import QWEN_VOCAB, check_same_tokens, random_logits, reference_tokens, seed  # noqa: F401

pytestmark = pytest.mark.hooks


def random_mask(rng, vocab, share):
    """About `share` of the vocabulary allowed (at least one token)."""
    allowed = np.flatnonzero(rng.random(vocab) < share)
    return TokenMask.allowing(allowed if allowed.size else [int(rng.integers(vocab))], vocab)


def random_bias(rng, vocab, n):
    ids = rng.choice(vocab, n, replace=False)
    return {int(i): float(b) for i, b in zip(ids, rng.uniform(-5.0, 5.0, n))}


def extras(rng, vocab, name):
    """SamplingParams fields past the filters', by name; seen ids drawn by the caller (the answer from 10 on)."""
    return {
        "bias": dict(logit_bias=random_bias(rng, vocab, 30)),
        "frequency": dict(frequency_penalty=float(rng.uniform(0.2, 2.0)), answer_start=10),
        "presence": dict(presence_penalty=float(rng.uniform(-2.0, 2.0)), answer_start=10),
        "both_penalties": dict(frequency_penalty=0.7, presence_penalty=-0.4, answer_start=10),
        "mask": dict(token_mask=random_mask(rng, vocab, 0.3)),
        "mask_few": dict(token_mask=random_mask(rng, vocab, 3.0 / vocab)),
        "all": dict(logit_bias=random_bias(rng, vocab, 30), frequency_penalty=0.5, presence_penalty=0.3,
                    answer_start=10, token_mask=random_mask(rng, vocab, 0.5)),
    }[name]


FILTERS = {
    "greedy": {},
    "temperature": dict(temperature=0.8),
    "qwen": dict(temperature=0.6, top_k=20, top_p=0.95),
    "every_filter": dict(temperature=0.9, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.2),
    "wide": dict(temperature=1.3, top_k=5000, top_p=0.99, min_p=0.0005, repeat_penalty=1.1),
}
EXTRAS = ["bias", "frequency", "presence", "both_penalties", "mask", "mask_few", "all"]


def seen_ids(rng, logits, vocab):
    """Forty ids, the first ten the prompt's and the rest the answer's, some repeated, the answer's led by the
    largest logits so that the penalties move the argmax."""
    answer = np.concatenate([np.argsort(-logits)[:6], rng.integers(0, vocab, 14)])
    answer = np.concatenate([answer, answer[:10]])  # each of them twice: frequency counts 2
    return np.concatenate([rng.integers(0, vocab, 10), answer]).astype(np.int64)


@pytest.mark.gpu
@pytest.mark.parametrize("filters", list(FILTERS))
@pytest.mark.parametrize("name", EXTRAS)
@pytest.mark.parametrize("vocab", [50, 10000])
def test_each_extra_alone_and_combined_with_the_filters(rng, seed, filters, name, vocab):
    for _ in range(3):
        logits = random_logits(rng, vocab)
        params = SamplingParams(**FILTERS[filters], **extras(rng, vocab, name))
        check_same_tokens(logits, params, rng.random(30), seen_ids(rng, logits, vocab), seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["bias", "both_penalties", "mask", "all"])
@pytest.mark.parametrize("filters", ["greedy", "qwen"])
def test_qwen_vocab_and_one_graph_for_every_draw(rng, seed, name, filters):
    logits = random_logits(rng, QWEN_VOCAB)
    params = SamplingParams(**FILTERS[filters], **extras(rng, QWEN_VOCAB, name))
    seen = seen_ids(rng, logits, QWEN_VOCAB)
    check_same_tokens(logits, params, rng.random(12), seen, seed=seed)
    check_same_tokens(logits, params, rng.random(12), seen, graph=True, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("name", EXTRAS)
@pytest.mark.parametrize("graph", [False, True])
def test_the_argmax_path_takes_them_as_the_sort_does(rng, seed, name, graph):
    vocab = 10000
    for params_of in (lambda e: SamplingParams(**e), lambda e: SamplingParams(temperature=1.2, top_k=1, **e)):
        logits = random_logits(rng, vocab)
        params = params_of(extras(rng, vocab, name))
        seen = seen_ids(rng, logits, vocab)
        draws = [0.0, 0.5, 0.999]
        fast = _native_check.sample_tokens(logits, params, draws, seen, graph=graph, argmax_path=True)
        by_sort = _native_check.sample_tokens(logits, params, draws, seen, graph=graph)
        want = reference_tokens(logits, params, draws, seen)
        assert fast.tolist() == by_sort.tolist() == want.tolist(), (seed, params)


@pytest.mark.gpu
@pytest.mark.parametrize("argmax_path", [False, True])
def test_a_mask_of_one_token_always_yields_it(rng, seed, argmax_path):
    logits = random_logits(rng, QWEN_VOCAB)
    for token in (int(rng.integers(QWEN_VOCAB)), 0, QWEN_VOCAB - 1, int(np.argmin(logits))):
        mask = TokenMask.allowing([token], QWEN_VOCAB)
        for filters in (FILTERS["greedy"], FILTERS["qwen"], FILTERS["every_filter"]):
            params = SamplingParams(**filters, token_mask=mask)
            if argmax_path and params.temperature and params.top_k != 1:
                continue
            got = _native_check.sample_tokens(logits, params, rng.random(8), argmax_path=argmax_path)
            assert set(got.tolist()) == {token}, f"seed={seed}: {got.tolist()}, the mask allows only {token}"


@pytest.mark.gpu
def test_a_bias_of_minus_100_is_never_chosen_and_plus_100_always(rng, seed):
    logits = random_logits(rng, QWEN_VOCAB)
    top = int(np.argmax(logits))
    for filters in (FILTERS["greedy"], FILTERS["temperature"], FILTERS["qwen"]):
        banned = SamplingParams(**filters, logit_bias={top: -100.0})
        got = _native_check.sample_tokens(logits, banned, rng.random(30))
        assert top not in got.tolist(), f"seed={seed}: {top} biased by -100 was drawn"
        pick = int(rng.integers(QWEN_VOCAB))
        forced = SamplingParams(**filters, logit_bias={pick: 100.0})
        got = _native_check.sample_tokens(logits, forced, rng.random(30))
        assert set(got.tolist()) == {pick}, f"seed={seed}: +100 on {pick} gave {got.tolist()}"


@pytest.mark.gpu
def test_penalties_move_the_argmax_as_the_reference_does(rng, seed):
    """The answer repeats the argmax: enough frequency or presence penalty moves greedy off it, to the reference's
    token; a negative one keeps it there; only the answer's part of the history counts."""
    logits = random_logits(rng, 10000)
    order = np.argsort(-logits)
    top, gap = int(order[0]), float(logits[order[0]] - logits[order[1]])
    seen = np.concatenate([[top] * 5, rng.integers(0, 10000, 5), [top, top]])  # top twice in the answer, from 10 on
    for fields in (dict(frequency_penalty=min(2.0, gap / 2 + 0.1)), dict(presence_penalty=min(2.0, gap + 0.1))):
        params = SamplingParams(answer_start=10, **fields)
        want = sample(logits, params, 0.5, seen)
        got = _native_check.sample_tokens(logits, params, [0.5], seen)
        assert got.tolist() == [want], f"seed={seed} {fields}: GPU {got.tolist()}, reference {want}"
        if gap < 1.9:
            assert want != top
        # the same ids in the prompt only: nothing to count
        prompt_only = _native_check.sample_tokens(logits, SamplingParams(answer_start=12, **fields), [0.5], seen)
        assert prompt_only.tolist() == [top]


@pytest.mark.gpu
def test_without_extras_every_path_gives_what_it_gave(rng, seed):
    """A zero bias and a mask allowing every token go through the flags' paths and pick what the plain sampler
    picks, draw for draw."""
    logits = random_logits(rng, QWEN_VOCAB)
    seen = rng.integers(0, QWEN_VOCAB, 50)
    everything = TokenMask.allowing(range(QWEN_VOCAB), QWEN_VOCAB)
    draws = rng.random(20)
    for filters in FILTERS.values():
        plain = _native_check.sample_tokens(logits, SamplingParams(**filters), draws, seen)
        flagged = SamplingParams(**filters, logit_bias={5: 0.0}, token_mask=everything)
        assert _native_check.sample_tokens(logits, flagged, draws, seen).tolist() == plain.tolist()


# Refusals come before any device work: these run without a GPU.
def test_a_mask_that_allows_no_token_is_refused():
    nothing = TokenMask(np.zeros(1, np.int32))
    with pytest.raises(strata.InvalidArgument, match="allows no token of the logits"):
        _native_check.sample_tokens(np.ones(10, np.float32), SamplingParams(token_mask=nothing), [0.5])
    beyond = TokenMask.allowing([12], 32)  # only a token past the 10 logits
    with pytest.raises(strata.InvalidArgument, match="allows no token of the logits"):
        _native_check.sample_tokens(np.ones(10, np.float32), SamplingParams(token_mask=beyond), [0.5])


def test_a_bias_outside_the_logits_is_refused():
    with pytest.raises(strata.InvalidArgument, match="logit_bias: token 10 is outside the 10 logits"):
        _native_check.sample_tokens(np.ones(10, np.float32), SamplingParams(logit_bias={10: 1.0}), [0.5])
