"""KV streaming (docs/session.md, "KV streaming") on the GPU: a session whose attention KV lives in page-locked host
memory, with a VRAM window of the QSA blocks each token reads, gives the logits of the session holding its KV in
VRAM bit for bit (the same kernels read the same cells in the same order; only where the cells lie differs), in
every KV format, through the prompt path and decode, every mode, a reset and a rolled-back conversation; it
fetches at most a selection's worth of blocks per token and layer; models whose attention has no indexer are
refused."""

from __future__ import annotations

import numpy as np
import pytest

from strata import _native
from strata.errors import InvalidArgument
from strata.options import KV, Mode
from strata.runtime.geometry import native_geometry
from strata.runtime.model import load
from strata.sampling import SamplingParams
from strata.synth import synthesize

pytestmark = pytest.mark.gpu

QUANT = {"experts": "q4_k", "expert_down": "q4_0", "dense": "q8_0", "embeddings": "q8_0", "ple": "q8_0"}
FLOAT = {"experts": "q8_0", "expert_down": "q8_0", "dense": "f32", "embeddings": "f32", "ple": "f32"}
# The tiny qwen4exp keeps 2 QSA blocks of 4 tokens (a budget of 8): past 11 tokens every token reads a sparse
# selection, so 300 prompt tokens (past a 256-token KV page) and 48 decoded ones move the window on every step.
PROMPT, STEPS, CONTEXT = 300, 48, 512
GREEDY = SamplingParams()


@pytest.fixture(scope="module", params=["f32", "quant"])
def model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("streaming") / f"qwen4exp-{request.param}.gguf"
    synthesize(path, "qwen4exp", "tiny", types=FLOAT if request.param == "f32" else QUANT, seed=5)
    loaded = load(path, progress=False, expert_cache=0)
    yield loaded
    loaded.close()


def prompt_ids(model, rng, n: int) -> list[int]:
    g = model.info.geometry
    eos = set(model.tokenizer.eos_ids) | {g.ple_eos}
    return [int(t) for t in rng.integers(0, g.n_vocab, 2 * n) if int(t) not in eos][:n]


def decode(model, prompt: list[int], kv: KV, streaming: bool, mode: Mode = Mode.TOKEN_GRAPH, session=None):
    """The prompt through the prompt path, then STEPS greedy tokens: (tokens, logits per step, stats)."""
    own = session is None
    session = session or model.session(CONTEXT, kv=kv, mode=mode, snapshots=0, kv_streaming=streaming)
    engine = session.engine
    try:
        history = list(prompt)
        token = engine.feed(prompt, GREEDY, 0.0, history)
        tokens, logits = [token], [engine.logits()]
        for _ in range(STEPS):
            history.append(token)
            token = engine.feed([token], GREEDY, 0.0, history)
            tokens.append(token)
            logits.append(engine.logits())
        return tokens, np.array(logits), engine.stats()
    finally:
        if own:
            session.close()


@pytest.mark.parametrize("kv", list(KV))
def test_streamed_kv_decodes_bit_for_bit_as_kv_held_in_vram(model, kv, rng):
    prompt = prompt_ids(model, rng, PROMPT)
    tokens, logits, _ = decode(model, prompt, kv, streaming=False)
    streamed_tokens, streamed_logits, stats = decode(model, prompt, kv, streaming=True)
    assert not np.isnan(streamed_logits).any()
    assert streamed_tokens == tokens
    assert np.array_equal(streamed_logits.view(np.uint32), logits.view(np.uint32))
    # Per decoded token and attention layer the window fetches at most a selection, the token's own block (the
    # fill) and the next token's (its claim).
    g = model.info.geometry
    layers = sum(not r for r in g.recurrent)
    ratio = g.qsa_block
    keep = g.indexer_top_k // ratio
    layout = _native.session_layout(native_geometry(g), CONTEXT, kv.value, 0, True)
    assert layout["window_slots"] == keep + 2
    per_block = ratio * g.n_head_kv * g.head_dim * {KV.BF16: 4, KV.INT8: 2 + 4 / 32, KV.K8V4: 1.5 + 4 / 32,
                                                     KV.Q4: 1 + 4 / 32}[kv]
    fetched = stats["kv_stream_bytes"] / STEPS
    assert 0 < fetched <= layers * (keep + 2) * per_block + 1e-6, (fetched, per_block)


def test_every_mode_and_a_reset_stream_the_same_tokens(model, rng):
    prompt = prompt_ids(model, rng, PROMPT)
    first = None
    for mode in Mode:
        session = model.session(CONTEXT, kv=KV.INT8, mode=mode, snapshots=0, kv_streaming=True)
        try:
            runs = []
            for _ in range(2):  # the second run after a reset: the windows start empty again
                session.engine.reset()
                runs.append(decode(model, prompt, KV.INT8, True, session=session))
        finally:
            session.close()
        assert np.array_equal(runs[0][1], runs[1][1]), mode
        first = runs[0][1] if first is None else first
        assert np.array_equal(runs[0][1], first), mode


def test_a_rolled_back_conversation_streams_as_it_decodes_in_vram(model, rng):
    def chat(streaming: bool) -> list[np.ndarray]:
        session = model.session(CONTEXT, kv=KV.K8V4, snapshots=2, kv_streaming=streaming)
        out = []
        try:
            first = prompt_ids(model, np.random.default_rng(3), 120)
            session.complete(first, max_tokens=4)
            out.append(session.engine.logits())
            longer = session.tokens + prompt_ids(model, np.random.default_rng(4), 40)
            session.complete(longer, max_tokens=3)
            out.append(session.engine.logits())
            edited = first + prompt_ids(model, np.random.default_rng(5), 30)  # back to the first prompt's end
            done = session.complete(edited, max_tokens=3)
            assert done.usage.cached_tokens >= len(first) - 1
            out.append(session.engine.logits())
        finally:
            session.close()
        return out

    for vram, streamed in zip(chat(False), chat(True)):
        assert np.array_equal(vram, streamed)


def test_models_whose_attention_reads_every_cell_refuse_streaming(tmp_path):
    path = tmp_path / "qwen3next.gguf"
    synthesize(path, "qwen3next", "tiny", types=QUANT, seed=2)
    with load(path, progress=False, expert_cache=0) as model:
        assert model.largest_context(KV.INT8, kv_streaming=True) == 0
        with pytest.raises(InvalidArgument, match="no QSA indexer"):
            model.session(256, kv=KV.INT8, kv_streaming=True)

