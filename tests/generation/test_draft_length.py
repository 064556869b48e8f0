"""The draft length policy (strata.generation.draft_length) on fake timings: it measures plain stepping first,
probes one draft, then picks the most tokens per second, stops drafting where it measures slower than
stepping and retries it now and then, so that it recovers."""

import pytest

import strata
from strata.generation.draft_length import DraftLength, FixedDraftLength, expected_tokens

STEP = 0.010  # seconds of a plain step


def run(policy: DraftLength, verify_cost, accepted, steps: int, cap: int = 7) -> list[int]:
    """`steps` decisions, each reported back with fake timings: a verify of k drafts costs verify_cost(k) and
    accepts accepted(k) of them."""
    chosen = []
    for _ in range(steps):
        k = policy.choose(cap)
        chosen.append(k)
        if k == 0:
            policy.stepped(STEP)
        else:
            policy.verified(k, accepted(k), verify_cost(k))
    return chosen


def test_expected_tokens_is_the_geometric_sum():
    assert expected_tokens(0, 0.3) == 1.0
    assert expected_tokens(3, 1.0) == 4.0
    assert expected_tokens(3, 0.5) == pytest.approx((1 - 0.5 ** 4) / (1 - 0.5))


def test_steps_plainly_first_then_probes_one_draft_then_follows_the_estimates():
    """After one draft measured 1.1 steps and was taken, the line through (0, 1) and (1, 1.1) makes 4 drafts the
    best: they are tried and measured; 2 and 3 are never paid for."""
    policy = DraftLength(4)
    chosen = run(policy, lambda k: STEP * (1 + 0.1 * k), lambda k: k, 5)
    assert chosen == [0, 1, 4, 4, 4]
    assert policy.step_seconds == STEP and policy.verify_seconds[1] == pytest.approx(0.011)
    assert policy.verify_seconds[4] == pytest.approx(0.014) and policy.verify_seconds[2:4] == [None, None]


def test_cheap_verifies_and_full_acceptance_choose_the_longest():
    policy = DraftLength(4)
    chosen = run(policy, lambda k: STEP * (1 + 0.1 * k), lambda k: k, 30)
    assert chosen[5:] == [4] * 25


def test_verifies_that_cost_a_step_per_token_never_draft_past_the_probe():
    """Each draft costs a whole step and half are accepted: stepping is faster, so after its one probe the
    policy steps (the longer lengths' estimates lose too, and are never paid for)."""
    policy = DraftLength(3, retry_after=1000)
    chosen = run(policy, lambda k: STEP * (1 + k), lambda k: k // 2, 40)
    assert chosen[:2] == [0, 1] and chosen[2:] == [0] * 38


def test_the_best_length_follows_the_acceptance_rate():
    """Verifies cost 1 + 0.3 k steps: with every draft accepted 4 drafts pay best; with none, stepping does."""
    cost = lambda k: STEP * (1 + 0.3 * k)  # noqa: E731
    taken = DraftLength(4, retry_after=1000)
    assert run(taken, cost, lambda k: k, 30)[-1] == 4
    refused = DraftLength(4, retry_after=1000)
    assert run(refused, cost, lambda k: 0, 30)[-10:] == [0] * 10
    assert refused.acceptance == 0.0


def test_a_disabled_drafter_is_retried_and_recovers():
    policy = DraftLength(2, retry_after=5)
    acceptance = {"now": 0}
    cost = lambda k: STEP * (1 + 0.2 * k)  # noqa: E731
    chosen = run(policy, cost, lambda k: acceptance["now"] * k, 33)
    # after the probe: stepping, drafting retried at the 5th decision, then after twice as many each time
    assert chosen[:2] == [0, 1] and [i for i, k in enumerate(chosen[2:], 1) if k] == [5, 10, 20]
    acceptance["now"] = 1  # the text starts repeating: every draft right
    chosen = run(policy, cost, lambda k: acceptance["now"] * k, 100)  # the next retry comes at the 40th
    # drafting wins; a plain step every 5th decision keeps its cost current
    zeros = [i for i, k in enumerate(chosen[-10:]) if k == 0]
    assert set(chosen[-10:]) == {0, 2} and len(zeros) == 2 and zeros[1] - zeros[0] == 5


def test_the_plain_steps_cost_is_measured_again_while_drafting_wins():
    """A first plain step that held a warm-up (10x) makes drafting look good; the plain steps retaken every
    `retry_after` decisions bring its cost down until stepping wins, as it should here."""
    policy = DraftLength(1, retry_after=4, smoothing=0.5)
    policy.stepped(10 * STEP)
    chosen = [policy.choose(1)]
    policy.verified(1, 0, 1.5 * STEP)  # slower than a true step, and nothing accepted
    for _ in range(40):
        k = policy.choose(1)
        chosen.append(k)
        policy.stepped(STEP) if k == 0 else policy.verified(1, 0, 1.5 * STEP)
    assert chosen[:5] == [1, 1, 1, 1, 0]  # the probe, then drafting until the 4th decision retakes a plain step
    assert policy.step_seconds < 1.1 * STEP and chosen[20:24] == [0] * 4  # stepping wins from decision 20 on
    # drafting is retried at stepping's 4th, 8th and 16th decisions: the losing verify waits twice as long each time
    assert [i for i, k in enumerate(chosen) if k and i >= 20] == [24, 28, 36]


def test_the_cap_bounds_every_choice():
    policy = DraftLength(6)
    chosen = run(policy, lambda k: STEP, lambda k: k, 20, cap=2)
    assert max(chosen) == 2 and chosen[-5:] == [2] * 5
    assert policy.choose(0) == 0 and policy.choose(-3) == 0


def test_a_length_the_drafter_never_filled_is_costed_on_the_measured_line():
    """The drafter gives at most 1 draft: lengths 2..4 are asked for (they cost nothing more) but never measured;
    their cost is extrapolated from the plain step and the 1-draft verify."""
    policy = DraftLength(4)
    policy.stepped(STEP)
    policy.verified(1, 1, 0.012)
    assert policy.cost(3) == pytest.approx(0.016)
    policy.verified(3, 1, 0.020)
    assert policy.cost(2) == pytest.approx(0.016) and policy.cost(4) == pytest.approx(0.024)


def test_bad_arguments_are_named():
    with pytest.raises(strata.InvalidArgument, match="max_drafts must be >= 1"):
        DraftLength(0)
    with pytest.raises(strata.InvalidArgument, match=r"smoothing must be in \(0, 1\]"):
        DraftLength(2, smoothing=0.0)
    with pytest.raises(strata.InvalidArgument, match="retry_after must be >= 1"):
        DraftLength(2, retry_after=0)
    with pytest.raises(strata.InvalidArgument, match="a verify of 3 drafts .at most 2. cannot accept 1"):
        DraftLength(2).verified(3, 1, 0.1)
    with pytest.raises(strata.InvalidArgument, match="drafts must be >= 0"):
        FixedDraftLength(-1)
    assert FixedDraftLength(3).choose(2) == 2 and FixedDraftLength(3).choose(5) == 3
