"""strata.bench.batch on the reference engine (the GPU box runs it on the benchmark model with the native batched
step): every batch size's record comes back, the sessions decode the plain run's greedy tokens (the reference
steps each in turn, exactly), and each session holds its prompt and the tokens decoded."""

import numpy as np

from strata.bench.batch import batch_sweep
from strata.format import inspect
from strata.generation import Session
from strata.reference import Reference
from strata.reference.engine import ReferenceEngine


def test_batch_sweep_on_the_reference(tiny_model, rng):
    with inspect(tiny_model("qwen35moe", seed=5)) as model_file:
        g = model_file.geometry
        prompts = {i: [int(t) for t in rng.integers(0, g.n_vocab, 4 + i)] for i in range(3)}
        opened = []

        def open_session():
            opened.append(Session(ReferenceEngine(Reference(model_file), 64, 0), model_file.tokenizer()))
            return opened[-1]

        got = batch_sweep(open_session, prompts.__getitem__, [1, 3], 5)
        assert np.isfinite(got["plain_tokens_per_second"]) and got["plain_tokens_per_second"] > 0
        assert sorted(got["batches"]) == [1, 3]
        for size, record in got["batches"].items():
            assert record["sessions"] == size and record["agrees"], (size, record)
            assert record["tokens_per_second"] > 0 and record["step_ms_worst"] >= record["step_ms_median"] > 0
        assert len(opened) == 3
        assert [s.engine.position for s in opened] == [len(prompts[i]) + 5 for i in range(3)]
