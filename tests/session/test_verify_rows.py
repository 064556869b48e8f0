"""Verification steps on the GPU (docs/speculative.md): `verify` runs k + 1 tokens as one prompt chunk and returns
every row's logits, keeping each row's recurrent state; `truncate` then cuts the sequence back to any of them.
Decoding after a cut is, bit for bit, what a session that only ever fed the kept tokens decodes, for all three
architectures, at every cut, in every mode, with the PLE n-gram state kept by the host or by the session, and with
KV streaming; QSA blocks completed inside the window are complete again only when their tokens are. (With the
prompt path's CPU share off, a token's experts run on the same side whatever the chunk, and every kernel's row is
independent of the others': the same bits are the bar, measured so on the box.)"""

import numpy as np
import pytest

from strata.errors import InvalidArgument
from strata.generation import Session
from strata.generation.draft_length import FixedDraftLength
from strata.generation.drafts import ForcedDrafter
from strata.options import Mode
from strata.runtime.engine import GpuEngine
from strata.sampling import SamplingParams

from support.compare import assert_same_bits, relative_errors
from support.native_session import open_native_session
from test_decode_session import GARBAGE
from test_prompt_path import bounds, loaded, prompt_ids, rows_of, staging  # noqa: F401 (loaded: a fixture)

pytestmark = pytest.mark.gpu

WINDOW = 5  # the pending token and four drafts


def engine(model, *, verify_rows=WINDOW, mode=Mode.TOKEN_GRAPH, kv="bf16", native_ple=False, **options):
    """A GPU engine over a session with row states; the PLE rows gathered by the host (the engine's own) or, with
    `native_ple`, by the session. The prompt path's CPU share is off so that a token's experts run on the same
    side in every chunk that holds it."""
    ple = rows_of(model)
    gather = ple.native() if native_ple and ple is not None else None
    native = open_native_session(model, context=256, kv=kv, mode=mode, prompt_chunk=8, staging=staging(model),
                                 prompt_cpu=False, verify_rows=verify_rows, ple=gather, **options)
    return GpuEngine(native, None if gather is not None else ple)


def fed(e, ids):
    e.prefill(ids, [0] * (e.position + len(ids)))


def verified(e, ids):
    rows = e.verify(ids, [0] * (e.position + len(ids)))
    assert np.all(np.isfinite(rows))
    return rows


def stepped(e, ids):
    out = []
    for t in ids:
        e.prefill([t], [0] * (e.position + 1))
        out.append(e.logits())
    return out


def cut_and_kept(model, rng, kept, **options):
    """Logits of the same continuation after (a) the window verified and cut back to `kept` tokens and (b) only
    those tokens verified; and (a)'s rows, (b)'s rows."""
    g = model.info.geometry
    prompt = prompt_ids(model, rng, 21)
    window = [int(t) for t in rng.integers(0, g.n_vocab, WINDOW)]
    then = [int(t) for t in rng.integers(0, g.n_vocab, 6)]
    cut, whole = engine(model, **options), engine(model, **options)
    try:
        fed(cut, prompt)
        fed(whole, prompt)
        rows_cut = verified(cut, window)
        cut.truncate(len(prompt) + kept)
        assert cut.position == len(prompt) + kept
        rows_kept = verified(whole, window[:kept])
        return stepped(cut, then), stepped(whole, then), rows_cut[:kept], rows_kept
    finally:
        cut.close()
        whole.close()


def assert_same_decoding(after_cut, after_kept, what):
    assert all(np.all(np.isfinite(x)) for x in after_cut), what
    assert_same_bits(np.array(after_cut), np.array(after_kept), f"{what}: logits after the cut")


@pytest.mark.parametrize("kept", range(1, WINDOW + 1))
def test_decoding_after_a_cut_matches_feeding_only_the_kept_tokens(loaded, kept, rng):
    name, model = loaded
    after_cut, after_kept, rows_cut, rows_kept = cut_and_kept(model, rng, kept)
    assert_same_bits(rows_cut, rows_kept, f"{name} kept {kept}: the kept rows' logits")
    assert_same_decoding(after_cut, after_kept, f"{name} kept {kept}")


@pytest.mark.parametrize("mode", list(Mode))
def test_a_cut_holds_in_every_mode(loaded, mode, rng):
    name, model = loaded
    if not name.startswith("qwen4exp"):
        pytest.skip("the modes share one truncate; one architecture with PLE and QSA shows it")
    after_cut, after_kept, _, _ = cut_and_kept(model, rng, 2, mode=mode)
    assert_same_decoding(after_cut, after_kept, f"{name} {mode}")


@pytest.mark.parametrize("options", [{"native_ple": True}, {"kv_streaming": True, "kv": "int8"}],
                         ids=["session-gathers-ple", "kv-streaming"])
def test_a_cut_holds_where_the_session_keeps_more_state(loaded, options, rng):
    name, model = loaded
    if not name.startswith("qwen4exp"):
        pytest.skip("PLE and KV streaming are qwen4exp's")
    after_cut, after_kept, _, _ = cut_and_kept(model, rng, 3, **options)
    assert_same_decoding(after_cut, after_kept, f"{name} {options}")


def test_verify_rows_stay_within_the_bounds_of_the_prompt_paths_logits(loaded, rng):
    """A verification is a step of one span (docs/rows.md), whose attention is the decode program's, a chunk's its
    own: each row within the decode bounds of the feed's every-position logits (the prompt path's)."""
    name, model = loaded
    g = model.info.geometry
    prompt = prompt_ids(model, rng, 12)
    window = [int(t) for t in rng.integers(0, g.n_vocab, WINDOW)]
    a, b = engine(model), engine(model)
    try:
        fed(a, prompt)
        fed(b, prompt)
        rows = verified(a, window)
        scored = b.score(window, [0] * (b.position + WINDOW))
        errors = relative_errors(list(rows), list(scored))
        print(f"{name}: verify rows against the prompt path, median {np.median(errors):.2e}, worst {errors.max():.2e}")
        assert np.median(errors) < bounds(name, "bf16") and errors.max() < GARBAGE, (name, errors)
    finally:
        a.close()
        b.close()


def test_refusals(loaded, rng):
    name, model = loaded
    with pytest.raises(InvalidArgument, match="verify rows must be in 0..8"):
        engine(model, verify_rows=9)
    with pytest.raises(InvalidArgument, match="need a prompt chunk of at least"):
        open_native_session(model, context=64, prompt_chunk=4, staging=staging(model), verify_rows=5)
    e = engine(model, verify_rows=3)
    try:
        with pytest.raises(InvalidArgument, match="truncate\\(\\) follows a verification step"):
            e.truncate(0)
        fed(e, [1, 2, 3])
        with pytest.raises(InvalidArgument, match="takes 1..3 tokens"):
            e.verify([4, 5, 6, 7], [0] * 7)
        assert e.position == 3  # refused before anything ran
        verified(e, [4, 5, 6])
        with pytest.raises(InvalidArgument, match="keeps 4..6 tokens, got 3"):
            e.truncate(3)
        e.truncate(5)
        e.truncate(4)  # a later cut may go further back within the window
        with pytest.raises(InvalidArgument, match="keeps 4..4 tokens, got 5"):
            e.truncate(5)
        fed(e, [9])
        with pytest.raises(InvalidArgument, match="follows a verification step"):
            e.truncate(4)
    finally:
        e.close()


def plain_greedy(model, prompt, tokens):
    """Greedy tokens stepped after `prompt`, and the top-two margin of each step's logits over their scale."""
    session = model.session(256, kv="bf16", prompt_cpu=False)
    try:
        engine, history = session.engine, list(prompt)
        token = engine.feed(prompt, SamplingParams(), 0.0, history)
        out, margins = [], []
        for _ in range(tokens):
            logits = engine.logits()
            top = np.sort(logits)[-2:]
            out.append(token)
            margins.append(float(top[1] - top[0]) / float(np.max(np.abs(logits))))
            history.append(token)
            token = engine.feed([token], SamplingParams(), 0.0, history)
        return out, margins
    finally:
        session.close()


@pytest.mark.parametrize("p", [0.0, 0.6, 1.0])
def test_drafted_greedy_decoding_yields_the_stepped_tokens(loaded, p, rng):
    """Model.session with drafts (ForcedDrafter at acceptance p, 3 a step) against stepping: the same tokens, up to
    the first step whose top two logits are closer than the prompt path and the decode path may differ (a
    near-tie either side may break its own way; test_prompt_path bounds that difference)."""
    name, model = loaded
    g = model.info.geometry
    prompt = prompt_ids(model, rng, 12)
    want, margins = plain_greedy(model, prompt, 24)
    session = model.session(256, kv="bf16", prompt_cpu=False, draft="lookup", draft_tokens=3)
    try:
        drafted = Session(session.engine, session.codec, ForcedDrafter(prompt + want, p, 5, vocab=g.n_vocab), 3,
                          draft_length=FixedDraftLength(3))
        got = list(drafted.complete(prompt, 24, temperature=0).tokens)
    finally:
        session.close()
    eos = set(model.tokenizer.eos_ids)
    ends = next((i for i, t in enumerate(want) if t in eos), len(want))  # a completion yields no EOS
    tie = next((i for i, m in enumerate(margins) if m < 2 * bounds(name, "bf16")), len(want))
    upto = min(ends, tie)
    print(f"{name} p={p}: {upto} tokens compared, acceptance {drafted.stats.acceptance_rate}, "
          f"{drafted.stats.tokens_per_step:.2f} tokens a step")
    assert got[:upto] == want[:upto], (name, p, got, want, upto)
    if upto == len(want) and p == 1.0:
        assert drafted.stats.acceptance_rate == 1.0
