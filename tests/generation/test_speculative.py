"""Speculative verification's definition (strata.sampling.accept_draft, verify_drafts) against stepping: greedy
yields exactly the tokens stepping picks, whatever was drafted; sampling yields tokens distributed as stepping's,
whatever the drafter's distribution (a frequency test, bounds below)."""

import numpy as np
import pytest

import strata
from strata.sampling import SamplingParams, accept_draft, candidates, sample, verify_drafts

V = 6  # a tiny vocabulary, so that every token's frequency is measured
TRIALS = 30_000
# Each token's frequency must lie within 5.5 binomial standard deviations (+ 1 / TRIALS) of its probability: a
# two-sided normal tail of 3.8e-8 per token, under 3e-7 for the six of one case: a correct rule never fails here.
SIGMAS = 5.5
PARAMS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=4),
          SamplingParams(temperature=1.3, top_p=0.8), SamplingParams(temperature=0.9, min_p=0.05, repeat_penalty=1.4)]


def target(logits: np.ndarray, params: SamplingParams, seen: list[int]) -> np.ndarray:
    """p over the vocabulary: the distribution `sample` draws from."""
    from strata.sampling import apply_repeat_penalty
    ids, probs = candidates(apply_repeat_penalty(logits, seen, params.repeat_penalty), params)
    p = np.zeros(logits.size)
    p[ids] = probs
    return p


def assert_distributed_as(tokens: list[int], p: np.ndarray, note: str) -> None:
    freq = np.bincount(tokens, minlength=p.size) / len(tokens)
    bound = SIGMAS * np.sqrt(p * (1 - p) / len(tokens)) + 1.0 / len(tokens)
    assert np.all(np.abs(freq - p) <= bound), f"{note}: frequencies {freq.round(4)} against {p.round(4)}"


@pytest.mark.parametrize("params", PARAMS, ids=str)
@pytest.mark.parametrize("drafter", ["certain", "outside the candidates", "random q", "q = p"])
def test_a_position_yields_tokens_distributed_as_stepping(rng, params, drafter):
    """A certain drafter proposes one fixed token (q a point mass); a drafter with a distribution q draws its
    draft from q at every trial, as the rule assumes. Either way the tokens yielded follow p, and the drafts are
    accepted at the rate the rule sets: p(d) for a certain draft, the sum of min(p, q) for a drawn one."""
    logits = (rng.standard_normal(V) * 1.5).astype(np.float32)
    seen = [int(rng.integers(V))]
    p = target(logits, params, seen)
    q = None
    fixed = int(rng.integers(V))
    if drafter == "outside the candidates" and np.any(p == 0):
        fixed = int(np.flatnonzero(p == 0)[0])  # p(d) = 0: always rejected, the residual is p itself
    if drafter == "random q":
        q = rng.dirichlet(np.ones(V))
    elif drafter == "q = p":
        q = p.copy()
    drafts = [fixed] * TRIALS if q is None else rng.choice(V, size=TRIALS, p=q / q.sum()).tolist()
    yielded, accepted = [], 0
    for draft, u in zip(drafts, rng.random((TRIALS, 2))):
        ok, token = accept_draft(logits, params, int(draft), u[0], u[1], seen, q)
        yielded.append(token)
        accepted += ok
        assert not ok or token == draft
    assert_distributed_as(yielded, p, f"{params}, {drafter}")
    if drafter == "q = p":
        assert accepted == TRIALS  # u q(d) < p(d) = q(d) for every u < 1
        return
    want = p[fixed] if q is None else float(np.minimum(p, q).sum())
    sigma = np.sqrt(want * (1 - want) / TRIALS)
    assert abs(accepted / TRIALS - want) <= SIGMAS * sigma + 1.0 / TRIALS, (accepted / TRIALS, want)


def test_greedy_accepts_exactly_the_argmax_and_yields_it_either_way(rng):
    logits = rng.standard_normal(50).astype(np.float32)
    best = int(np.argmax(logits))
    assert accept_draft(logits, SamplingParams(), best, 0.99, 0.5) == (True, best)
    other = (best + 1) % 50
    assert accept_draft(logits, SamplingParams(), other, 0.0, 0.0) == (False, best)
    # The penalty moves the argmax: the draft is judged against the penalized logits, as stepping picks.
    logits[[3, 9]] = [5.0, 4.5]
    assert accept_draft(logits, SamplingParams(repeat_penalty=2.0), 9, 0.5, 0.5, seen=[3]) == (True, 9)


class ToyModel:
    """Logits that depend on the last token only (a fixed random table): enough to step and to verify."""

    def __init__(self, rng: np.random.Generator):
        self.table = (rng.standard_normal((V, V)) * 2).astype(np.float32)

    def rows(self, context: list[int], drafts: list[int]) -> np.ndarray:
        return np.stack([self.table[t] for t in [context[-1], *drafts]])

    def step(self, context: list[int], params: SamplingParams, n: int, rng: np.random.Generator) -> list[int]:
        out = list(context)
        for _ in range(n):
            out.append(sample(self.table[out[-1]], params, rng.random(), out))
        return out[len(context):]


@pytest.mark.parametrize("penalty", [1.0, 1.5])
def test_greedy_verification_yields_stepping_tokens_with_a_rejection_at_every_position(rng, penalty):
    model, params = ToyModel(rng), SamplingParams(repeat_penalty=penalty)
    context = [int(t) for t in rng.integers(V, size=5)]
    k = 4
    stepped = model.step(context, params, k + 1, rng)
    # Every draft right: k + 1 tokens, the last from the row after the drafts.
    assert verify_drafts(model.rows(context, stepped[:k]), params, stepped[:k], rng.random((k + 1, 2)), context) \
        == stepped
    for wrong in range(k):  # the first wrong draft at position `wrong`: stepping's tokens up to it, its own last
        drafts = list(stepped[:k])
        drafts[wrong] = (drafts[wrong] + 1 + int(rng.integers(V - 1))) % V
        got = verify_drafts(model.rows(context, drafts), params, drafts, rng.random((k + 1, 2)), context)
        assert got == stepped[:wrong + 1], (wrong, drafts, got, stepped)


def test_verification_yields_the_first_token_distributed_as_stepping(rng):
    model, params = ToyModel(rng), SamplingParams(temperature=1.0, repeat_penalty=1.2)
    context = [2, 4, 1]
    drafts = [int(t) for t in rng.integers(V, size=3)]
    rows = model.rows(context, drafts)
    first = [verify_drafts(rows, params, drafts, u, context)[0] for u in rng.random((TRIALS, 4, 2))]
    assert_distributed_as(first, target(rows[0], params, context), f"drafts {drafts}")


def test_bad_arguments_are_named():
    logits = np.zeros(V, np.float32)
    params = SamplingParams(temperature=1.0)
    with pytest.raises(strata.InvalidArgument, match="draft token 6 is outside the 6 logits"):
        accept_draft(logits, params, 6, 0.1, 0.1)
    with pytest.raises(strata.InvalidArgument, match=r"uniform draw must be in \[0, 1\), got 1.0"):
        accept_draft(logits, params, 0, 1.0, 0.1)
    with pytest.raises(strata.InvalidArgument, match="draft_probs must be 6 finite probabilities"):
        accept_draft(logits, params, 0, 0.1, 0.1, draft_probs=np.ones(5) / 5)
    with pytest.raises(strata.InvalidArgument, match="q\\(draft\\) > 0"):
        accept_draft(logits, params, 0, 0.1, 0.1, draft_probs=np.eye(V)[1])
    with pytest.raises(strata.InvalidArgument, match=r"2 drafts need 3 rows of logits and \(3, 2\) uniforms"):
        verify_drafts(np.zeros((2, V)), params, [0, 1], np.zeros((3, 2)))
    with pytest.raises(strata.InvalidArgument, match="NaN or infinity"):
        accept_draft(np.full(V, np.nan, np.float32), params, 0, 0.1, 0.1)
