"""The GPU engine's Python side on the CPU: PleRows vs the reference n-gram hash, GpuEngine over a fake
native DecodeSession, Model.session's argument and memory checks."""

from __future__ import annotations

import dataclasses
import importlib
import threading
from types import SimpleNamespace

import gguf
import numpy as np
import pytest

from support.ple_tables import ids_with_eos, table_file
from strata import _native
from strata.devices import Device
from strata.errors import FormatError, InvalidArgument, OutOfMemory, StrataError
from strata.options import KV, Mode
from strata.runtime.prompt import PROMPT_MIN_TOKENS
from strata.runtime.engine import GpuEngine
from strata.format import inspect
from strata.generation import Session
from strata.runtime.model import Model, describe
from strata.runtime.plan import SESSION_SLACK_BYTES
from strata.runtime.ple_rows import TABLE, PleRows
from strata.reference.ple import ngram_context, ngram_rows
from strata.sampling import SamplingParams, TokenMask
from strata.synth import presets, synthesize

T = gguf.GGMLQuantizationType


class FakeDecodeSession:
    """Records every call the engine makes; samples `position * 7 % n_vocab` so answers are checkable (under a token
    mask, the first id it allows from there on). A draw whose mask comes with a ticket waits for the ticket to be
    published, as the device's sampler does, and past `timeout` raises what the native step raises then (the token
    fed)."""

    def __init__(self, weights=None, pool=None, geometry=None, *, context=64, kv=KV.INT8, mode=Mode.TOKEN_GRAPH,
                 device=0, timeout=5.0, snapshots=0, cache=None, prompt_chunk=0, staging=None, prompt_cpu=True,
                 kv_streaming=False, defer_experts=0, ple=None, verify_rows=0, n_vocab=512):
        self.args = dict(weights=weights, pool=pool, geometry=geometry, context=context, kv=kv, mode=mode,
                         device=device, timeout=timeout, snapshots=snapshots, cache=cache, prompt_chunk=prompt_chunk,
                         staging=staging, prompt_cpu=prompt_cpu, kv_streaming=kv_streaming,
                         defer_experts=defer_experts, ple=ple, verify_rows=verify_rows)
        self.saved: dict[int, int] = {}
        self.context, self.mode, self.position, self.n_vocab = context, mode, 0, n_vocab
        self.prompt_chunk, self.verify_rows = prompt_chunk, verify_rows
        # as the native key: what the step's rows share, none without a prompt path or with KV streaming
        self.batch_key = None if not prompt_chunk or kv_streaming else f"{id(weights)}/{context}/{kv}"
        self.feeds: list[tuple] = []
        self.verified = 0  # the last verify's ids; truncate cuts back into them
        self.steps: list[tuple] = []
        self.resets = self.closes = 0
        self.published: list[int] = []  # the mask tickets published, in order
        self.drawn_under: np.ndarray | None = None  # the mask words the last masked draw read
        self._publication = threading.Condition()

    def feed(self, tokens, ple_rows, params, u, sample=True, logits=None):
        self.feeds.append((list(tokens), None if ple_rows is None else ple_rows.copy(), params, u, sample))
        if logits is not None:
            logits[...] = np.arange(len(tokens))[:, None]  # row i: i everywhere
        self.position += len(tokens)
        return self.position * 7 % self.n_vocab if sample else -1

    def verify(self, tokens, ple_rows, logits=None):
        if logits is None:
            logits = self.verified_rows()[:len(tokens)]
        self.feed(tokens, ple_rows, GREEDY_VALUES, 0.0, sample=False, logits=logits)
        self.verified = len(tokens)
        return logits

    def verified_rows(self):
        """The native session's page-locked rows, as a plain array here: one block every verification reuses."""
        if not hasattr(self, "_rows"):
            self._rows = np.zeros((max(self.verify_rows, 1), self.n_vocab), np.float32)
        return self._rows

    def truncate(self, position):
        if not self.position - self.verified < position <= self.position:
            raise InvalidArgument(f"truncate to {position} outside the verified window")
        self.verified -= self.position - position
        self.position = position

    def step(self, token, ple_rows, params, u, sample=True):
        masked = sample and len(params) >= 10 and params[9]
        deferred = masked and len(params) == 11
        if masked and not deferred:
            self.check_token_mask()  # refused before anything changes, as the native step refuses it
        self.steps.append((token, None if ple_rows is None else ple_rows.copy(), params, u, sample))
        self.position += 1
        if deferred:
            self._await_mask(params[10])
        return self._draw(masked) if sample else -1

    def _draw(self, masked):
        first = self.position * 7 % self.n_vocab
        if not masked:
            return first
        self.drawn_under = self.token_mask_words().copy()
        allowed = np.flatnonzero(np.roll(self._allowed(), -first))
        return (first + int(allowed[0])) % self.n_vocab

    def _allowed(self):
        return np.unpackbits(self.token_mask_words().view(np.uint8), bitorder="little")[:self.n_vocab]

    def _await_mask(self, ticket):
        timeout = self.args["timeout"]
        with self._publication:
            if not self._publication.wait_for(lambda: self.published[-1:] == [ticket], timeout):
                raise StrataError(f"the token mask of draw {ticket} was not published within {timeout} s")

    def publish_token_mask(self, ticket):
        with self._publication:
            self.published.append(ticket)
            self._publication.notify_all()

    def check_token_mask(self):
        if not self._allowed().any():
            raise InvalidArgument("the token mask allows no token of the logits")

    def reset(self):
        self.position = 0
        self.resets += 1
        self.saved.clear()

    def snapshot(self, slot):
        self.saved[slot] = self.position

    def restore(self, slot):
        if slot not in self.saved:
            raise InvalidArgument(f"state snapshot slot {slot} holds no snapshot")
        self.position = self.saved[slot]

    captured = False

    def token_mask_words(self):
        """The native session's page-locked mask words, as a plain array here."""
        if not hasattr(self, "_mask"):
            self._mask = np.zeros(-(-self.n_vocab // 32), np.int32)
        return self._mask

    def logprobs(self, token, n, token_mask=False):
        self.logprobs_asked = (token, n, token_mask)
        return 0.0, []

    def stats(self):
        return {"tokens": self.position, "seconds": 0.5, "ring_wait_seconds": 0.1, "pool_seconds": 0.2, "rings": 0,
                "gpu_pre_seconds": 0.0, "gpu_post_seconds": 0.0}

    def close(self):
        self.closes += 1


GREEDY_VALUES = (0.0, 0, 1.0, 0.0, 1.0)


@pytest.mark.parametrize("kept", [1, 3, 5])
def test_truncate_after_verify_rebuilds_the_hosts_ngram_state(tiny_qwen4exp, rng, kept):
    g = tiny_qwen4exp.geometry
    prompt = [int(t) for t in rng.integers(0, g.n_vocab, 9)]
    window = [int(t) for t in rng.integers(0, g.n_vocab, 5)]
    engine = GpuEngine(FakeDecodeSession(prompt_chunk=8, verify_rows=5), PleRows(tiny_qwen4exp, g))
    engine.prefill(prompt, prompt)
    logits = engine.verify(window, prompt + window)
    assert logits.shape == (5, 512) and engine.verify_rows == 5
    assert engine.native.feeds[-1][1].shape[0] == 5  # every verified id's PLE rows went with it
    engine.truncate(len(prompt) + kept)
    assert engine.position == len(prompt) + kept
    stepped = PleRows(tiny_qwen4exp, g)
    stepped.rows_for(prompt + window[:kept])
    np.testing.assert_array_equal(engine.ple.previous, stepped.previous)
    # the next token's rows follow the kept ids, not the cut ones
    np.testing.assert_array_equal(engine.ple.rows(7), stepped.rows(7))


def test_a_second_truncate_cuts_the_hosts_ngram_state_further_back(tiny_qwen4exp, rng):
    g = tiny_qwen4exp.geometry
    prompt = [int(t) for t in rng.integers(0, g.n_vocab, 9)]
    window = [int(t) for t in rng.integers(0, g.n_vocab, 5)]
    engine = GpuEngine(FakeDecodeSession(prompt_chunk=8, verify_rows=5), PleRows(tiny_qwen4exp, g))
    engine.prefill(prompt, prompt)
    engine.verify(window, prompt + window)
    engine.truncate(len(prompt) + 4)
    engine.truncate(len(prompt) + 2)  # within the same window, further back
    stepped = PleRows(tiny_qwen4exp, g)
    stepped.rows_for(prompt + window[:2])
    np.testing.assert_array_equal(engine.ple.previous, stepped.previous)


def _reference_rows(table: np.ndarray, shape, ids: list[int]) -> np.ndarray:
    """[T, heads, width]: the reference hash of every id, rows looked up in the float table."""
    ctx = ngram_context(np.full(shape.ngram - 1, shape.eos), np.array(ids), shape.eos)
    return table[ngram_rows(ctx, shape)]


@pytest.fixture(scope="module")
def tiny_qwen4exp(tmp_path_factory):
    path = tmp_path_factory.mktemp("engine") / "tiny.gguf"
    synthesize(path, "qwen4exp", seed=5)
    with inspect(path) as file:
        yield file


def test_ple_rows_match_the_reference_hash_on_a_synth_file(tiny_qwen4exp, rng):
    from strata.reference.weights import FileWeights

    g = tiny_qwen4exp.geometry
    ids = ids_with_eos(g, rng)
    table = FileWeights(tiny_qwen4exp).get(TABLE)
    expected = _reference_rows(table, g.ple, ids)
    rows = PleRows(tiny_qwen4exp, g)
    for t, token in enumerate(ids):
        got = rows.rows(token)
        assert got.dtype == np.float32 and got.shape == (g.ple_n_heads, g.ple_head_dim)
        # Bit-exact: the same dequantization of the same bytes.
        assert np.array_equal(got, expected[t]), f"token {t} ({token}) of {ids}"
    rows.reset()
    assert np.array_equal(rows.rows(ids[0]), expected[0]), "reset must bring back the EOS-filled history"


@pytest.mark.parametrize("ggml_type", [T.F32, T.Q8_0, T.Q4_0])
def test_ple_rows_dequantize_any_table_type(ggml_type, rng):
    g = presets.geometry("qwen4exp", "tiny")
    g = dataclasses.replace(g, ple_head_dim=32)  # rows of whole 32-element blocks
    file, floats = table_file(g, ggml_type, rng)
    ids = ids_with_eos(g, rng)
    expected = _reference_rows(floats, g.ple, ids)
    rows = PleRows(file, g)
    got = np.stack([rows.rows(t) for t in ids])
    assert np.isfinite(got).all()
    # gguf.quants' dequantization is the definition (docs/forms.md: bit-exact).
    assert np.array_equal(got, expected), f"ids {ids}"


def test_ple_rows_refuses_a_table_of_the_wrong_width(rng):
    g = presets.geometry("qwen4exp", "tiny")
    file, _ = table_file(dataclasses.replace(g, ple_head_dim=32), T.F32, rng)
    with pytest.raises(FormatError, match="per_layer_token_embd.weight: ne"):
        PleRows(file, g)


def test_feed_samples_only_on_the_last_id_and_passes_ple_rows(tiny_qwen4exp, rng):
    g = tiny_qwen4exp.geometry
    native = FakeDecodeSession()
    engine = GpuEngine(native, PleRows(tiny_qwen4exp, g))
    params = SamplingParams(0.7, 40, 0.9, 0.05, 1.1)
    prompt = ids_with_eos(g, rng)[:6]
    u = float(rng.random())
    token = engine.feed(prompt, params, u, prompt)
    assert token == 6 * 7 and engine.position == 6
    assert [s[0] for s in native.steps] == prompt
    assert [s[4] for s in native.steps] == [False] * 5 + [True]
    assert all(s[2] == (0.7, 40, 0.9, 0.05, 1.1) and s[3] == u for s in native.steps)
    expected = PleRows(tiny_qwen4exp, g)
    for step, t in zip(native.steps, prompt):
        assert np.array_equal(step[1], expected.rows(t)), f"PLE rows of token {t} in {prompt}"
    assert engine.feed([token], params, u, prompt + [token]) == 7 * 7
    assert native.steps[-1][4] is True


def test_long_feeds_take_the_prompt_path_with_every_tokens_ple_rows(tiny_qwen4exp, rng):
    g = tiny_qwen4exp.geometry
    native = FakeDecodeSession(context=256, prompt_chunk=16)
    engine = GpuEngine(native, PleRows(tiny_qwen4exp, g))
    prompt = (ids_with_eos(g, rng) * 8)[:PROMPT_MIN_TOKENS + 5]
    token = engine.feed(prompt, SamplingParams(), 0.25, prompt)
    assert token == len(prompt) * 7 % 512 and native.steps == []
    (ids, rows, _, u, sample), = native.feeds
    assert ids == prompt and u == 0.25 and sample
    expected = PleRows(tiny_qwen4exp, g)
    assert np.array_equal(rows, np.stack([expected.rows(t) for t in prompt]))
    short = prompt[:PROMPT_MIN_TOKENS - 1]  # a short feed steps token by token
    engine.feed(short, SamplingParams(), 0.25, prompt + short)
    assert len(native.feeds) == 1 and [s[0] for s in native.steps] == short


def test_score_returns_every_positions_logits_through_the_prompt_path(tiny_qwen4exp, rng):
    g = tiny_qwen4exp.geometry
    native = FakeDecodeSession(context=64, prompt_chunk=16)
    engine = GpuEngine(native, PleRows(tiny_qwen4exp, g))
    ids = [1, 2, 3]
    logits = engine.score(ids, ids)  # a short prompt too: scoring always takes the path
    assert logits.shape == (3, 512) and np.array_equal(logits[:, 7], [0, 1, 2])
    (fed, rows, _, _, sample), = native.feeds
    assert fed == ids and sample is False and rows.shape == (3, g.ple.n_heads, g.ple.head_dim)
    with pytest.raises(InvalidArgument, match="score\\(\\) needs the prompt path"):
        GpuEngine(FakeDecodeSession()).score([1], [1])


def test_feed_prompt_path_takes_the_path_below_its_threshold_and_says_the_chunk(tiny_qwen4exp, rng):
    g = tiny_qwen4exp.geometry
    native = FakeDecodeSession(context=64, prompt_chunk=16)
    engine = GpuEngine(native, PleRows(tiny_qwen4exp, g))
    ids = ids_with_eos(g, rng)[:PROMPT_MIN_TOKENS - 5]  # feed() would step these one by one
    token = engine.feed_prompt_path(ids, SamplingParams(), 0.5, ids)
    assert engine.prompt_chunk == 16 and token == len(ids) * 7 % 512 and native.steps == []
    (fed, rows, _, u, sample), = native.feeds
    assert fed == ids and u == 0.5 and sample and rows.shape == (len(ids), g.ple.n_heads, g.ple.head_dim)
    with pytest.raises(StrataError, match="history"):
        engine.feed_prompt_path([1, 2], SamplingParams(), 0.5, [1, 2])  # the session holds ids already
    stepping = GpuEngine(FakeDecodeSession())
    assert stepping.prompt_chunk == 0
    with pytest.raises(InvalidArgument, match="feed_prompt_path\\(\\) needs the prompt path"):
        stepping.feed_prompt_path([1], SamplingParams(), 0.0, [1])


@pytest.mark.parametrize("seed", range(4))
def test_ple_rows_of_a_whole_prompt_are_the_rows_token_by_token(tiny_qwen4exp, seed):
    g = tiny_qwen4exp.geometry
    rng = np.random.default_rng(seed)
    ids = [int(t) for t in rng.integers(0, g.n_vocab, 40)]
    ids[3] = ids[4] = ids[20] = g.ple_eos  # the n-gram resets after each EOS, also across two calls
    one_by_one = PleRows(tiny_qwen4exp, g)
    whole = PleRows(tiny_qwen4exp, g)
    expected = np.stack([one_by_one.rows(t) for t in ids])
    got = np.concatenate([whole.rows_for(ids[:21]), whole.rows_for(ids[21:])])
    assert np.array_equal(got, expected)
    assert np.array_equal(whole.previous, one_by_one.previous)


def test_feed_refuses_a_history_the_native_session_does_not_hold():
    engine = GpuEngine(FakeDecodeSession())
    engine.feed([1, 2], SamplingParams(), 0.5, [1, 2])
    with pytest.raises(StrataError, match="`seen` has 2 ids, but the session holds 2 and is fed 1"):
        engine.feed([3], SamplingParams(), 0.5, [1, 2])
    with pytest.raises(InvalidArgument):
        engine.feed([], SamplingParams(), 0.5, [1, 2])


def test_engine_without_ple_passes_none_and_reset_restarts_the_ngram_history(tiny_qwen4exp):
    native = FakeDecodeSession()
    GpuEngine(native).feed([5, 6], SamplingParams(), 0.0, [5, 6])
    assert [s[1] for s in native.steps] == [None, None]

    g = tiny_qwen4exp.geometry
    native = FakeDecodeSession()
    engine = GpuEngine(native, PleRows(tiny_qwen4exp, g))
    engine.feed([5, 6], SamplingParams(), 0.0, [5, 6])
    engine.reset()
    assert native.resets == 1 and engine.position == 0
    engine.feed([6], SamplingParams(), 0.0, [6])
    assert np.array_equal(native.steps[-1][1], PleRows(tiny_qwen4exp, g).rows(6))
    assert engine.stats()["tokens"] == 1 and engine.context == 64


def test_generation_session_streams_over_the_gpu_engine(tiny_qwen4exp):
    native = FakeDecodeSession(context=32)
    session = Session(GpuEngine(native), tiny_qwen4exp.tokenizer())
    pieces = list(session.generate([1, 2, 3], max_tokens=3))
    assert [p.token for p in pieces] == [21, 28, 35]
    assert session.stats.finish_reason == "length"
    list(session.generate([4], max_tokens=1))  # the pending last token is fed first, history stays in step
    assert [s[0] for s in native.steps] == [1, 2, 3, 21, 28, 35, 4]


def test_gpu_engine_snapshots_keep_the_ple_ids_with_the_native_state(tiny_qwen4exp):
    g = tiny_qwen4exp.geometry
    engine = GpuEngine(FakeDecodeSession(context=32), PleRows(tiny_qwen4exp, g), snapshots=2)
    greedy = SamplingParams()
    engine.feed([1, 2, 3], greedy, 0.0, [1, 2, 3])
    engine.snapshot(0)
    engine.feed([4, 5], greedy, 0.0, [1, 2, 3, 4, 5])
    engine.restore(0)
    assert engine.position == 3
    fresh = PleRows(tiny_qwen4exp, g)
    for token in (1, 2, 3):
        fresh.rows(token)
    assert np.array_equal(engine.ple.rows(9), fresh.rows(9))  # the n-gram context is 2, 3 again
    engine.reset()
    with pytest.raises(InvalidArgument, match="holds no snapshot"):
        engine.restore(0)  # reset forgets every snapshot


def test_session_graphs_report_the_mode_capture_and_stage_timing(tiny_qwen4exp):
    native = FakeDecodeSession(context=32, mode=Mode.LAYER_GRAPHS)
    native.captured = True
    with Session(GpuEngine(native), tiny_qwen4exp.tokenizer()) as session:
        list(session.generate([1, 2], max_tokens=2))
        graphs = session.graphs
        assert (graphs.mode, graphs.captured, graphs.tokens) == (Mode.LAYER_GRAPHS, True, 3)
        # per token: the sums the native session keeps, divided by its tokens; host is the rest of the step
        assert graphs.timing["ring_wait"] == pytest.approx(0.1 / 3) and graphs.timing["pool"] == pytest.approx(0.2 / 3)
        assert graphs.timing["host"] == pytest.approx((0.5 - 0.3) / 3)
        assert graphs.timing["gpu_pre"] == graphs.timing["gpu_post"] == 0.0
    assert native.closes == 1  # leaving the with block closed the engine


def test_host_time_is_the_step_outside_every_stage_in_every_mode():
    from strata.runtime.engine import per_token_timing

    # uncaptured: the host waits on the GPU's events (gpu pre / post), not on rings: neither is host time
    stats = {"seconds": 1.2, "ring_wait_seconds": 0.0, "pool_seconds": 0.5, "gpu_pre_seconds": 0.4,
             "gpu_post_seconds": 0.1}
    assert per_token_timing(stats, 4)["host"] == pytest.approx(0.2 / 4)
    # a wall clock around the calls counts the Python around them as host time too
    assert per_token_timing(stats, 4, seconds=1.6)["host"] == pytest.approx(0.6 / 4)


def test_a_session_without_graphs_says_none():
    class Plain:
        context, position = 8, 0

        def feed(self, ids, params, u, seen):
            return 0

        def reset(self):
            pass

    session = Session(Plain(), SimpleNamespace(encode=list, decode=str, eos_ids=[]))
    assert session.graphs is None
    session.close()  # an engine without close() is fine


def _model(file) -> Model:
    return Model(file, describe(file), weights="device-weights", pool=SimpleNamespace(native="pool-native"))


@pytest.fixture
def fake_gpu(monkeypatch):
    """One 'GPU' with settable free memory and a fake native DecodeSession."""
    gpu = {"free": 80 << 30}
    module = importlib.import_module("strata.devices")  # the package's `devices` attribute is the function
    monkeypatch.setattr(module, "devices", lambda: [Device(0, "fake", (9, 0), 96 << 30, gpu["free"], 132)])
    monkeypatch.setattr(_native, "DecodeSession", FakeDecodeSession, raising=False)
    return gpu


def test_model_session_builds_a_native_session_with_the_geometry(tiny_qwen4exp, fake_gpu):
    model = _model(tiny_qwen4exp)
    session = model.session()
    native = session.engine.native
    g = tiny_qwen4exp.geometry
    assert native.args["context"] == min(g.context_length, 4096) and native.args["kv"] is KV.INT8
    assert native.args["mode"] is Mode.TOKEN_GRAPH and native.args["pool"] == "pool-native"
    assert native.args["geometry"]["ple_layer"] == g.ple_layers[0]
    assert isinstance(native.args["ple"], _native.PleGather)  # the tiny table is f32: the session gathers its rows
    assert session.engine.ple is None
    assert native.args["snapshots"] == 2 and session.engine.snapshots == 2
    assert native.args["cache"] is None  # the model was loaded without an expert cache
    assert native.args["prompt_chunk"] == 0 and native.args["staging"] is None  # nor a prompt path
    assert native.args["defer_experts"] == 0  # off unless asked: the exact path
    session = model.session(context=100, kv="bf16", mode="uncaptured", timeout=1.5, snapshots=0, defer_experts=1)
    assert (session.engine.native.args["context"], session.engine.native.args["kv"]) == (100, KV.BF16)
    assert session.engine.native.args["timeout"] == 1.5 and session.engine.native.args["snapshots"] == 0
    assert session.engine.native.args["defer_experts"] == 1


def test_model_session_runs_on_the_models_device(tiny_qwen4exp, fake_gpu):
    model = _model(tiny_qwen4exp)
    model.device = 1  # the fake machine has only GPU 0: the refusal shows which device the session chose
    with pytest.raises(InvalidArgument, match="device index 1 out of range"):
        model.session()


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"context": 0}, "context 0 is outside 1..4096"),
    ({"context": 5000}, "context 5000 is outside 1..4096"),
    ({"kv": "q3"}, "unknown KV format 'q3'"),
    ({"mode": "graphs"}, "unknown session mode 'graphs'"),
    ({"timeout": 0}, "timeout must be > 0"),
    ({"snapshots": -1}, "snapshots must be in 0..64"),
    ({"defer_experts": -1}, r"defer_experts must be in 0\.\.\d+ \(below the \d+ routed experts of a token\), got -1"),
    ({"defer_experts": 99}, r"defer_experts must be in 0\.\.\d+ .* got 99"),
])
def test_model_session_argument_errors(tiny_qwen4exp, fake_gpu, kwargs, fragment):
    with pytest.raises(InvalidArgument, match=fragment):
        _model(tiny_qwen4exp).session(**kwargs)


def test_model_session_refuses_a_context_the_gpu_cannot_hold(tiny_qwen4exp, fake_gpu):
    model = _model(tiny_qwen4exp)
    # The session's allocation slack and 1 MiB: a few KV pages of the tiny model fit (~0.4 MiB), 4096 tokens
    # (~2 MiB) not.
    fake_gpu["free"] = SESSION_SLACK_BYTES + (1 << 20)
    with pytest.raises(OutOfMemory, match=r"GPU 0 has 0.02 GiB free; the plan of context 4096 with kv=int8 needs .* "
                                          r"in place\); would fit: context <= \d+ with kv=bf16"):
        model.session(context=4096)
    fake_gpu["free"] = 0
    with pytest.raises(OutOfMemory, match="nothing fits"):
        model.session(16)


def fake_step_rows(calls: list):
    """_native.step_rows over FakeDecodeSessions: each verifying part as verify(), each plain one as step()."""
    def step_rows(sessions, tokens, ple_rows, verify, params, us, logits):
        calls.append((list(map(list, tokens)), ple_rows, list(verify)))
        out = []
        for i, session in enumerate(sessions):
            rows = None if ple_rows is None else ple_rows[i]
            if verify[i]:
                session.verify(tokens[i], rows, logits[i])
                out.append(-1)
            else:
                out.append(session.step(tokens[i][0], rows, params[i], us[i]))
        return out
    return step_rows


def stepping_pair(tiny_qwen4exp, rng):
    g = tiny_qwen4exp.geometry
    engines = [GpuEngine(FakeDecodeSession(prompt_chunk=8, verify_rows=5), PleRows(tiny_qwen4exp, g), batch_key="k")
               for _ in range(2)]
    prompts = [[int(t) for t in rng.integers(0, g.n_vocab, n)] for n in (9, 6)]
    for engine, prompt in zip(engines, prompts):
        engine.prefill(prompt, prompt)
    return engines, prompts


def test_step_rows_verifies_and_steps_and_keeps_each_hosts_ngram_state(tiny_qwen4exp, rng, monkeypatch):
    g = tiny_qwen4exp.geometry
    calls: list = []
    monkeypatch.setattr(_native, "step_rows", fake_step_rows(calls))
    (drafting, plain), (p0, p1) = stepping_pair(tiny_qwen4exp, rng)
    window, token = [int(t) for t in rng.integers(0, g.n_vocab, 4)], 11
    got = GpuEngine.step_rows([drafting, plain], [window, [token]], [True, False], [SamplingParams()] * 2, [0.0, 0.3],
                              [p0 + window, p1 + [token]])
    assert got[0].shape == (4, 512) and np.all(got[0] == np.arange(4)[:, None])  # the verified rows' logits
    assert got[1] == plain.position * 7 % 512 and plain.position == len(p1) + 1
    assert calls[0][0] == [window, [token]] and calls[0][2] == [True, False]
    # each part's PLE rows are those its session would gather alone
    alone = [PleRows(tiny_qwen4exp, g), PleRows(tiny_qwen4exp, g)]
    alone[0].rows_for(p0)
    alone[1].rows_for(p1)
    np.testing.assert_array_equal(calls[0][1][0], alone[0].rows_for(window))
    np.testing.assert_array_equal(calls[0][1][1], alone[1].rows(token))
    # a cut after the step rebuilds the drafting engine's n-gram state from the kept ids
    drafting.truncate(len(p0) + 2)
    kept = PleRows(tiny_qwen4exp, g)
    kept.rows_for(p0 + window[:2])
    np.testing.assert_array_equal(drafting.ple.previous, kept.previous)


def test_a_refused_step_of_rows_leaves_each_hosts_ngram_state(tiny_qwen4exp, rng, monkeypatch):
    def refuse(*args):
        raise InvalidArgument("session 0 of the step verifies 1..5 tokens (its verify rows), got 6")

    monkeypatch.setattr(_native, "step_rows", refuse)
    monkeypatch.setattr(_native, "step_batch", refuse)
    engines, prompts = stepping_pair(tiny_qwen4exp, rng)
    before = [e.ple.previous.copy() for e in engines]
    with pytest.raises(InvalidArgument, match="got 6"):
        GpuEngine.step_rows(engines, [[1] * 6, [2]], [True, False], [SamplingParams()] * 2, [0.0, 0.0],
                            [prompts[0] + [1] * 6, prompts[1] + [2]])
    with pytest.raises(InvalidArgument, match="got 6"):
        GpuEngine.step_batch(engines, [1, 2], [SamplingParams()] * 2, [0.0, 0.0], [prompts[0] + [1], prompts[1] + [2]])
    for engine, previous, prompt in zip(engines, before, prompts):
        np.testing.assert_array_equal(engine.ple.previous, previous)
        assert engine.position == len(prompt)


def test_step_rows_refuses_a_plain_part_of_several_ids_and_engines_of_other_keys(tiny_qwen4exp, rng):
    engines, prompts = stepping_pair(tiny_qwen4exp, rng)
    with pytest.raises(InvalidArgument, match="does not verify steps one id, got 2"):
        GpuEngine.step_rows(engines, [[1], [2, 3]], [True, False], [SamplingParams()] * 2, [0.0, 0.0],
                            [prompts[0] + [1], prompts[1] + [2, 3]])
    engines[1].batch_key = "other"
    with pytest.raises(InvalidArgument, match="engines of one batch key"):
        GpuEngine.step_rows(engines, [[1], [2]], [False, False], [SamplingParams()] * 2, [0.0, 0.0],
                            [prompts[0] + [1], prompts[1] + [2]])
    assert [e.position for e in engines] == [len(p) for p in prompts]


def test_verify_returns_the_sessions_reused_block_of_rows(tiny_qwen4exp, rng):
    """The rows come back in the native session's one page-locked block (no array made per verification): the
    next verification overwrites them."""
    g = tiny_qwen4exp.geometry
    engine = GpuEngine(FakeDecodeSession(prompt_chunk=8, verify_rows=5), PleRows(tiny_qwen4exp, g))
    engine.prefill([1, 2, 3], [1, 2, 3])
    first = engine.verify([4, 5, 6], [1, 2, 3, 4, 5, 6])
    assert first.shape == (3, 512) and np.shares_memory(first, engine.native.verified_rows())
    engine.truncate(4)
    second = engine.verify([7, 8], [1, 2, 3, 4, 7, 8])
    assert second.shape == (2, 512) and np.shares_memory(first, second)


def test_a_draws_mask_and_bias_reach_the_native_session_and_plain_draws_stay_five_values():
    native = FakeDecodeSession(prompt_chunk=8, verify_rows=3, n_vocab=100)
    engine = GpuEngine(native, batch_key="k")
    engine.feed([1], SamplingParams(temperature=0.5), 0.25, [1])
    assert native.steps[-1][2] == (0.5, 0, 1.0, 0.0, 1.0)  # what every draw staged before
    computed = []
    mask = TokenMask(size=4, compute=lambda out: (computed.append(1), out.__setitem__(0, 0b1010)))
    params = SamplingParams(token_mask=mask, logit_bias={7: -2.0}, frequency_penalty=0.5, answer_start=1)
    engine.feed([2], params, 0.5, [1, 2])  # the mask made lazily: computed while the step runs, with a ticket
    assert native.steps[-1][2] == (0.0, 0, 1.0, 0.0, 1.0, 0.5, 0.0, 1, ((7, -2.0),), True, 1)
    assert computed == [1] and native.token_mask_words()[:4].tolist() == [0b1010, 0, 0, 0]
    engine.logprobs(3, 5, mask)  # tokens 1 and 3 allowed: at most two alternatives
    assert native.logprobs_asked == (3, 2, True)
    with pytest.raises(InvalidArgument, match="token 2 is not one the token mask allows"):
        engine.logprobs(2, 5, mask)


def test_a_verification_part_never_computes_its_rows_mask():
    native = FakeDecodeSession(prompt_chunk=8, verify_rows=3, n_vocab=100)
    engine = GpuEngine(native, batch_key="k")
    untouched = TokenMask(size=4, compute=lambda out: pytest.fail("a verification computed its mask"))
    sampled = []
    fake_rows = lambda sessions, ids, rows, verify, sampling, us, logits: sampled.extend(sampling) or [-1]
    original, _native.step_rows = _native.step_rows, fake_rows
    try:
        GpuEngine.step_rows([engine], [[1, 2]], [True], [SamplingParams(token_mask=untouched)], [0.0], [[1, 2]])
    finally:
        _native.step_rows = original
    assert sampled == [(0.0, 0, 1.0, 0.0, 1.0)]
