"""strata.bench.drafts on the reference engine (the GPU box runs it on the benchmark model): the verify costs come
back for every k asked, the cut leaves the sequence one token longer each time, and decode with forced drafts
yields the plain tokens at every rate, accepting all of them at rate 1 and none at rate 0."""

import numpy as np

from strata.bench.drafts import forced_decode, verify_costs
from strata.format import inspect
from strata.generation import Session
from strata.reference import Reference
from strata.reference.engine import ReferenceEngine


def session(model_file, verify_rows=4):
    return Session(ReferenceEngine(Reference(model_file), 64, 0, verify_rows=verify_rows), model_file.tokenizer())


def test_verify_costs_and_forced_decode_on_the_reference(tiny_model, rng):
    with inspect(tiny_model("qwen3next", seed=4)) as model_file:
        g = model_file.geometry
        prompt = [int(t) for t in rng.integers(0, g.n_vocab, 6)]
        s = session(model_file)
        costs = verify_costs(s, prompt, [1, 3], 3, g.n_vocab, rng)
        assert costs["step_seconds"] > 0 and costs["verify_1_steps"] > 0 and costs["verify_3_steps"] > 0
        assert s.engine.position == len(prompt) + 3 + 3 + 3  # plain steps, then one kept token per verify
        forced = forced_decode(s, prompt, 10, 3, [0.0, 1.0], g.n_vocab, seed=1)
        rates = forced["rates"]
        for p in (0.0, 1.0):
            assert rates[p]["same_tokens"], (p, rates[p])
        if forced["tokens"] > 2:  # an answer that ends at once (EOS) leaves nothing to draft
            assert rates[1.0]["acceptance"] == 1.0 and rates[1.0]["tokens_per_step"] > 1.0
            assert rates[0.0]["acceptance"] == 0.0
        assert np.isfinite(forced["plain_tokens_per_second"]) and s.engine.position == 0
