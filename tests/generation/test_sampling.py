"""The sampling reference against direct formulas: each filter alone, the draw, ties, bad parameters."""

import numpy as np
import pytest

import strata
from strata.sampling import SamplingParams, TokenMask, apply_repeat_penalty, candidates, sample


def softmax64(z):
    z = np.asarray(z, np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def test_greedy_picks_argmax_and_breaks_ties_to_the_lower_id(rng):
    logits = rng.standard_normal(1000).astype(np.float32)
    assert sample(logits, SamplingParams(), 0.7) == int(np.argmax(logits))
    logits[[17, 400]] = logits.max() + 1.0
    assert sample(logits, SamplingParams(), 0.3) == 17


def test_temperature_only_keeps_the_full_distribution(rng):
    logits = rng.standard_normal(64).astype(np.float32)
    ids, probs = candidates(logits, SamplingParams(temperature=0.7))
    want = softmax64(logits.astype(np.float64) / 0.7)
    assert sorted(ids.tolist()) == list(range(64))
    np.testing.assert_allclose(probs, want[ids], rtol=1e-12)
    assert np.all(np.diff(probs) <= 0)


def test_top_k_top_p_min_p_each_cut_where_the_formula_says(rng):
    logits = rng.standard_normal(200).astype(np.float32) * 3
    ids, _ = candidates(logits, SamplingParams(temperature=1.0, top_k=7))
    assert ids.tolist() == np.argsort(-logits, kind="stable")[:7].tolist()

    full = softmax64(logits)
    order = np.argsort(-full, kind="stable")
    mass = np.cumsum(full[order])
    ids, _ = candidates(logits, SamplingParams(temperature=1.0, top_p=0.8))
    want = int(np.argmax(mass >= 0.8)) + 1  # the smallest prefix reaching 0.8
    assert ids.tolist() == order[:want].tolist()

    ids, _ = candidates(logits, SamplingParams(temperature=1.0, min_p=0.1))
    assert set(ids.tolist()) == set(np.flatnonzero(full >= 0.1 * full.max()).tolist())


def test_draws_follow_the_distribution(rng):
    logits = np.log(np.array([0.5, 0.3, 0.2], np.float32))
    params = SamplingParams(temperature=1.0)
    assert [sample(logits, params, u) for u in (0.0, 0.49, 0.51, 0.79, 0.81, 0.999)] == [0, 0, 1, 1, 2, 2]
    draws = [sample(logits, params, rng.random()) for _ in range(4000)]
    freq = np.bincount(draws, minlength=3) / 4000
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.2], atol=0.04)  # ~5 sigma of a binomial at n=4000


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits(rng):
    logits = rng.standard_normal(50).astype(np.float32)
    seen = [3, 3, 9, 20]
    out = apply_repeat_penalty(logits, seen, 1.3)
    for i in range(50):
        if i in seen:
            want = logits[i] / 1.3 if logits[i] > 0 else logits[i] * 1.3
            assert out[i] == pytest.approx(want, rel=1e-6)
        else:
            assert out[i] == logits[i]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"temperature": -1.0}, "temperature must be >= 0"),
        ({"top_k": -2}, "top_k must be >= 0"),
        ({"top_p": 0.0}, "top_p must be in"),
        ({"min_p": 1.0}, "min_p must be in"),
        ({"repeat_penalty": 0.0}, "repeat_penalty must be > 0"),
        ({"temperature": float("nan")}, "must be finite"),
        ({"frequency_penalty": 2.5}, "frequency_penalty must be in"),
        ({"presence_penalty": -3}, "presence_penalty must be in"),
        ({"logit_bias": {-1: 1.0}}, "token ids are integers >= 0"),
        ({"logit_bias": {3: 101}}, "bias must be a number in"),
        ({"logit_bias": [(3, 1.0, 2)]}, "pairs or a mapping"),
    ],
)
def test_bad_parameters_name_themselves(kwargs, fragment):
    with pytest.raises(strata.InvalidArgument, match=fragment):
        SamplingParams(**kwargs)


def test_masked_copies_the_parameters_with_a_mask_and_leaves_them_as_they_were():
    params = SamplingParams(temperature=0.7, top_k=5, logit_bias={3: 1.0}, answer_start=2)
    mask = TokenMask.allowing([1, 3], 64)
    masked = params.masked(mask)
    assert masked == params and masked.token_mask is mask and params.token_mask is None
    assert (masked.temperature, masked.top_k, masked.logit_bias, masked.answer_start) == (0.7, 5, ((3, 1.0),), 2)
    assert masked.masked(None).token_mask is None
    with pytest.raises(strata.InvalidArgument, match="token_mask must be a TokenMask or None, got list"):
        params.masked([1, 3])


def test_nan_logits_are_refused():
    with pytest.raises(strata.InvalidArgument, match="NaN"):
        sample(np.array([0.0, np.nan], np.float32), SamplingParams(temperature=1.0), 0.5)


def test_numpy_scalars_become_python_numbers():
    params = SamplingParams(temperature=np.float32(0.5), top_k=np.int64(3), repeat_penalty=np.float64(1.1))
    assert type(params.temperature) is float and type(params.top_k) is int and type(params.repeat_penalty) is float


def test_logit_bias_is_added_to_the_logits_before_everything_else(rng):
    logits = rng.standard_normal(40).astype(np.float32)
    low = int(np.argmin(logits))
    params = SamplingParams(logit_bias={low: 100.0})
    assert sample(logits, params, 0.3) == low
    assert params.logit_bias == ((low, 100.0),) and params.extended() == ["logit_bias"]
    biased = logits.copy()
    biased[[2, 7]] += np.float32(-1.5)
    ids, probs = candidates(biased, SamplingParams(temperature=0.9))
    draws = [sample(logits, SamplingParams(temperature=0.9, logit_bias=[(7, -1.5), (2, -1.5)]), u)
             for u in (0.1, 0.5, 0.9)]
    assert draws == [sample(biased, SamplingParams(temperature=0.9), u) for u in (0.1, 0.5, 0.9)]
    with pytest.raises(strata.InvalidArgument, match="outside the 40 logits"):
        sample(logits, SamplingParams(logit_bias={40: 1.0}), 0.5)


def test_frequency_and_presence_penalties_count_only_the_answer(rng):
    """OpenAI's definitions: logit - count * frequency - (count > 0) * presence, over seen[answer_start:]."""
    logits = np.zeros(10, np.float32)
    logits[4], logits[6] = 2.0, 1.5
    seen = [4, 4, 4, 1, 4, 4, 6]  # the prompt is the first three
    for frequency, presence, answer_start, want in [(0.6, 0.0, 3, 6), (0.0, 1.5, 3, 4), (0.0, 1.5, 7, 4),
                                                    (0.3, 0.0, 0, 6), (0.3, 0.0, 3, 4), (0.0, 0.0, 0, 4)]:
        params = SamplingParams(frequency_penalty=frequency, presence_penalty=presence, answer_start=answer_start)
        assert sample(logits, params, 0.5, seen) == want, (frequency, presence, answer_start)
    # the distribution drawn from is the formula's
    params = SamplingParams(temperature=1.0, frequency_penalty=0.5, presence_penalty=0.25, answer_start=3)
    ids, probs = candidates(logits - np.array([0, 0.75, 0, 0, 1.25, 0, 0.75, 0, 0, 0], np.float32),
                            SamplingParams(temperature=1.0))
    counts = {u: sample(logits, params, u, seen) for u in np.linspace(0, 0.999, 50)}
    assert counts == {u: int(ids[min(np.searchsorted(np.cumsum(probs), u, side="right"), ids.size - 1)])
                      for u in counts}


def test_a_temperature_too_small_for_the_division_draws_the_top_token(rng):
    logits = rng.standard_normal(30).astype(np.float32) * 5
    logits[11] = max(9.0, float(logits.max()) + 1.0)  # the top logit, whatever the draw
    ids, probs = candidates(logits, SamplingParams(temperature=1e-300))  # an overflow warning fails the test
    assert ids[0] == 11 and probs[0] == 1.0 and sample(logits, SamplingParams(temperature=1e-300), 0.99) == 11
