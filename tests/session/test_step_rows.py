"""Steps of several sessions' rows on the GPU (docs/rows.md): DecodeSession.step_rows runs verifications of several
sessions and plain steps of others as one step of their rows laid end to end, on the first one's prompt program.
Each verifying session's rows are, bit for bit, its verification alone, and a cut after it keeps what a cut after
that verification keeps; each plain session's token and logits are its step in a batch of one; for all three
architectures, in the uncaptured mode and a captured one. (With the prompt path's CPU share off, a token's experts
run on the GPU in every chunk and step.)"""

import numpy as np
import pytest

from strata.errors import InvalidArgument
from strata.options import Mode
from strata.runtime.engine import GpuEngine
from strata.sampling import SamplingParams

from support.compare import assert_same_bits
from support.native_session import GREEDY, open_native_session
from test_prompt_path import loaded, prompt_ids, rows_of, staging  # noqa: F401 (loaded: a fixture)

pytestmark = pytest.mark.gpu

CONTEXT = 256
VERIFY_ROWS = 5


def engine(model, staged, mode):
    native = open_native_session(model, context=CONTEXT, kv="bf16", mode=mode, prompt_chunk=16, staging=staged,
                                 prompt_cpu=False, verify_rows=VERIFY_ROWS)
    return GpuEngine(native, rows_of(model), batch_key="model")


def seen(e, n):
    return [0] * (e.position + n)


def fed(e, ids):
    e.prefill(ids, seen(e, len(ids)))


# Two sessions verify (4 and 2 ids), one steps a token greedily, one with the sampling of a draw.
PARTS = [(4, True), (1, False), (2, True), (1, False)]


@pytest.mark.parametrize("mode", [Mode.UNCAPTURED, Mode.TOKEN_GRAPH])
def test_verifications_and_steps_in_one_step_are_each_alone(loaded, mode, rng):
    name, model = loaded
    g = model.info.geometry
    prompts = [prompt_ids(model, rng, n) for n in (13, 9, 21, 7)]
    staged_together, staged_apart = staging(model), staging(model)  # sessions of one step share a staging
    together = [engine(model, staged_together, mode) for _ in PARTS]
    apart = [engine(model, staged_apart, mode) for _ in PARTS]
    try:
        for prompt, a, b in zip(prompts, together, apart):
            fed(a, prompt)
            fed(b, prompt)
        for step in range(2):  # the second replays the first's graph where the mode captures
            ids = [[int(t) for t in rng.integers(0, g.n_vocab, count)] for count, _ in PARTS]
            verify = [v for _, v in PARTS]
            params = [SamplingParams(), SamplingParams(), SamplingParams(),
                      SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.02, repeat_penalty=1.1)]
            us = [float(u) for u in rng.random(len(PARTS))]
            starts = [e.position for e in together]
            got = GpuEngine.step_rows(together, ids, verify, params, us,
                                      [seen(e, len(part)) for e, part in zip(together, ids)])
            for i, (a, b) in enumerate(zip(together, apart)):
                what = f"{name} {mode} step {step} session {i}"
                if verify[i]:
                    want = b.verify(ids[i], seen(b, len(ids[i])))
                    assert got[i].shape == want.shape and np.all(np.isfinite(got[i])), what
                    assert_same_bits(got[i], want, f"{what}: verified rows")
                    kept = 1 + step % len(ids[i])  # cut both back alike: a different cut each step
                    a.truncate(starts[i] + kept)
                    b.truncate(starts[i] + kept)
                else:
                    p = params[i]
                    sampling = (p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty)
                    want = GpuEngine.step_rows([b], [ids[i]], [False], [p], [us[i]], [seen(b, 1)])[0]
                    assert got[i] == want, (what, got[i], want, sampling)
                    assert_same_bits(a.logits(), b.logits(), f"{what}: logits")
                assert a.position == b.position, what
        # the state each part left decodes on as its twin's
        then = [int(t) for t in rng.integers(0, g.n_vocab, 3)]
        for i, (a, b) in enumerate(zip(together, apart)):
            for t in then:
                a.prefill([t], seen(a, 1))
                b.prefill([t], seen(b, 1))
                assert np.all(np.isfinite(a.logits()))
                assert_same_bits(a.logits(), b.logits(), f"{name} {mode} session {i}: decoding after the steps")
    finally:
        for e in together + apart:
            e.close()


def test_refusals_leave_every_session_as_it_was(loaded, rng):
    name, model = loaded
    staged = staging(model)
    engines = [engine(model, staged, Mode.TOKEN_GRAPH) for _ in range(2)]
    try:
        for e in engines:
            fed(e, prompt_ids(model, rng, 9))
        positions = [e.position for e in engines]
        greedy = [SamplingParams()] * 2

        def refused(ids, verify, match):
            with pytest.raises(InvalidArgument, match=match):
                GpuEngine.step_rows(engines, ids, verify, greedy, [0.0, 0.0],
                                    [seen(e, len(part)) for e, part in zip(engines, ids)])
            assert [e.position for e in engines] == positions, (name, match)

        refused([[1, 2], [3]], [False, False], "steps one id, got 2")
        refused([[1] * (VERIFY_ROWS + 1), [3]], [True, False], rf"verifies 1..{VERIFY_ROWS} tokens \(its verify "
                                                                 rf"rows\), got {VERIFY_ROWS + 1}")
    finally:
        for e in engines:
            e.close()
