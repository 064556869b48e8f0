"""strata.bench on the CPU: the rates, the limit arithmetic, the cache rules, the report, a run over a fake session;
on the GPU: the native rate measurements."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from strata import _native
from strata.bench import rates as bench_rates
from strata.bench import run as bench_run
from strata.bench.decode import decode, prompt_ids
from strata.bench.default_model import bench_model, cache_dir
from strata.bench.limit import machine_limit
from strata.bench.prompt import prompt_report, prompt_speed
from strata.bench.rates import Rates
from strata.bench.report import report
from strata.bench.run import run
from strata.bench.tiers import DiskRate
from strata.errors import InvalidArgument
from strata.format import inspect
from strata.generation import Session
from strata.generation.draft_length import FixedDraftLength
from strata.generation.drafts import ForcedDrafter
from strata.options import KV, Mode
from strata.runtime.engine import GpuEngine
from strata.synth import synthesize

# The GPU box's rates (docs/performance.md), given: the limit's arithmetic on known numbers.
RATES = Rates(host_read=20e9, pcie_upload=55e9, hbm_copy=4.2e12, doorbell_round_trip=3.1e-6)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny qwen4exp: f32 everywhere but the experts (q8_0: 34 bytes per 32 weights)."""
    path = tmp_path_factory.mktemp("bench") / "tiny.gguf"
    synthesize(path, "qwen4exp", types={"experts": "q8_0", "expert_down": "q8_0"}, seed=2)
    with inspect(path) as file:
        yield file


def _tensors(file):
    return {name: (t.ggml_type, t.ne) for name, t in file.tensors.items()}


def test_limit_matches_a_hand_computation(tiny):
    g = tiny.geometry
    # Each expert's gate, up and down hold n_embd * expert_ff weights; q8_0 stores 34 bytes per 32.
    per_expert = 3 * g.n_embd * g.expert_ff // 32 * 34
    routed = g.n_layer * g.n_expert_used * per_expert
    dense = 4 * sum(math.prod(t.ne) for name, t in tiny.tensors.items()
                    if "_exps." not in name and name not in ("per_layer_token_embd.weight", "token_embd.weight"))
    limit = machine_limit(g, _tensors(tiny), RATES)
    assert (limit.routed_bytes, limit.dense_bytes) == (routed, dense)
    expected = routed / 20e9 + dense / 4.2e12 + g.n_layer * 3.1e-6
    assert math.isclose(limit.seconds, expected, rel_tol=1e-12), (limit, expected)  # same sums, other order
    with pytest.raises(InvalidArgument, match="read bandwidth must be > 0"):
        machine_limit(g, _tensors(tiny), dataclasses.replace(RATES, host_read=0.0))


def test_the_limit_moves_cached_experts_to_hbm_and_drops_their_doorbells(tiny):
    g = tiny.geometry
    pool_only = machine_limit(g, _tensors(tiny), RATES)
    slots = [g.n_expert] + [g.n_expert // 2] * (g.n_layer - 1)  # the first layer whole, the others half
    cached = machine_limit(g, _tensors(tiny), RATES, slots=slots)
    per_layer = pool_only.routed_bytes / g.n_layer
    held = per_layer * (1 + (g.n_layer - 1) / 2)
    assert math.isclose(cached.cached_bytes, held, abs_tol=1) and cached.routed_bytes + cached.cached_bytes == \
        pool_only.routed_bytes
    assert cached.dense_bytes == pool_only.dense_bytes + cached.cached_bytes
    assert math.isclose(cached.doorbell_seconds, (g.n_layer - 1) * 3.1e-6)
    everything = machine_limit(g, _tensors(tiny), RATES, slots=[g.n_expert] * g.n_layer)
    assert everything.routed_bytes == 0 and everything.doorbell_seconds == 0


def test_cache_dir_rules(tmp_path):
    assert cache_dir({"STRATA_CACHE": "/c", "XDG_CACHE_HOME": "/x"}) == Path("/c")
    assert cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/strata")
    assert cache_dir({"STRATA_CACHE": "", "XDG_CACHE_HOME": ""}) == Path.home() / ".cache" / "strata"


def test_bench_model_is_synthesized_once_then_reused(tmp_path, capsys):
    calls = []

    def fake_synth(path, arch, **kwargs):
        calls.append((Path(path), arch, kwargs))
        Path(path).write_bytes(b"GGUF model")

    cache = tmp_path / "cache"
    path = bench_model(cache, fake_synth)
    assert path == cache / "qwen4exp-bench-16L.gguf" and path.read_bytes() == b"GGUF model"
    assert calls == [(path, "qwen4exp", {"preset": "bench", "n_layer": 16, "progress": None})]
    assert "synthesizing the default benchmark model" in capsys.readouterr().err
    assert bench_model(cache, fake_synth) == path and len(calls) == 1  # reused, not synthesized again


def test_what_a_killed_bench_synth_left_is_removed_and_an_interrupted_one_leaves_nothing(tmp_path):
    def tiny(path, arch, **kwargs):  # the real synthesis, of a model small enough for a test
        return synthesize(path, "qwen3next", preset="tiny", n_layer=1, progress=kwargs["progress"])

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)
    name = "qwen4exp-bench-16L.gguf"
    # a bench killed mid-way: its own temporary file (benches named one before synth wrote under one) and synth's
    for left in (f"{name}.partial-{gone.pid}", f"{name}.partial-{gone.pid}.partial-{gone.pid}"):
        (tmp_path / left).write_bytes(b"half a model")

    def interrupted(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        bench_model(tmp_path, tiny, interrupted)
    assert list(tmp_path.iterdir()) == []
    path = bench_model(tmp_path, tiny)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_prompt_ids_avoid_the_ple_eos(tiny, rng):
    g = tiny.geometry
    ids = prompt_ids(g, 2000, rng)
    assert len(ids) == 2000 and g.ple_eos not in ids and 0 <= min(ids) and max(ids) < g.n_vocab


class TimedFakeSession:
    """A native session whose stats grow by fixed amounts per step."""

    def __init__(self, mode: str):
        self.mode, self.context, self.position, self.closed = mode, 4096, 0, False
        self.prompt_chunk = 0  # no prompt path: every id steps
        self.sums = dict.fromkeys(("ring_wait_seconds", "pool_seconds", "gpu_pre_seconds", "gpu_post_seconds"), 0.0)

    def step(self, token, ple_rows, params, u, sample=True):
        self.position += 1
        self.sums["ring_wait_seconds"] += 1e-4
        self.sums["pool_seconds"] += 2e-4
        return (token + 1) % 512 if sample else -1

    def reset(self):
        self.position = 0

    def stats(self):
        hits = [self.position, 2 * self.position]  # a quarter of the routed experts cached, in two layers
        return {"tokens": self.position, **self.sums, "expert_hits": hits,
                "expert_misses": [3 * self.position, 2 * self.position], "expert_copies": [self.position, 0]}

    def close(self):
        self.closed = True


class VerifyingEngine(GpuEngine):
    """The GPU engine over a TimedFakeSession, with verify and truncate: token t is followed by t + 1."""

    verify_rows = 4

    def verify(self, ids, seen):
        for token in ids:
            self.native.step(token, None, None, 0.0, sample=False)
        rows = np.full((len(ids), 512), -1.0, np.float32)
        rows[np.arange(len(ids)), (np.asarray(ids) + 1) % 512] = 1.0
        return rows

    def truncate(self, position):
        self.native.position = position


def test_decode_with_drafts_runs_the_sessions_loop_and_reports_the_acceptance():
    codec = SimpleNamespace(eos_ids=[], decode=lambda ids: "")
    drafter = ForcedDrafter(list(range(5, 40)), 1.0, vocab=512)  # position i holds i + 5: every draft right
    session = Session(VerifyingEngine(TimedFakeSession("token_graph")), codec, drafter, 3,
                      draft_length=FixedDraftLength(3))
    result = decode(session, [5, 6, 7], 8)
    # after the prompt's token, two verifies of 3 drafts yield 4 tokens each
    assert (result["tokens"], result["acceptance_rate"], result["tokens_per_step"]) == (8, 1.0, 4.0)
    assert session.tokens == list(range(5, 17)) and math.isclose(result["pool_seconds"], 2e-4)


def test_the_probe_brackets_the_timed_tokens_only():
    """A caller's counters (the disk tier's) are read after the prompt's step and after the last timed token: the
    prompt's chunk, which reads its rows' whole union of experts, stays out of the per-token figures."""
    native = TimedFakeSession("token_graph")
    result = decode(Session(GpuEngine(native), codec=None), [5, 6, 7], 8, probe=lambda: native.position)
    assert result["probe"] == (3, 11)  # three prompt ids stepped before the first read, eight tokens between
    assert "probe" not in decode(Session(GpuEngine(TimedFakeSession("token_graph")), codec=None), [5], 2)


@pytest.fixture
def native_rates(monkeypatch):
    """The native measurements of GPU 3 at the GPU box's rates; each records the device it was asked about."""
    asked = []

    def rate(value):
        return lambda device, *args: asked.append(device) or value

    monkeypatch.setattr(_native, "pinned_upload_rate", rate(55e9))
    monkeypatch.setattr(_native, "device_copy_rate", rate(4.2e12))
    monkeypatch.setattr(_native, "doorbell_round_trip", rate(3.1e-6))
    return asked


def test_rates_are_measured_by_the_pool_and_on_the_models_gpu(native_rates):
    pool = SimpleNamespace(read_bandwidth=lambda nbytes: nbytes / 1e-2)  # a buffer read in 10 ms
    rates = bench_rates.measure(pool, 3)
    assert rates == Rates(bench_rates.READ_BANDWIDTH_BYTES / 1e-2, 55e9, 4.2e12, 3.1e-6)
    assert native_rates == [3, 3, 3]


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(Rates)])
@pytest.mark.parametrize("wrong", [0.0, -1.0, math.nan, math.inf])
def test_rates_refuse_a_measurement_that_is_not_positive_and_finite(field, wrong):
    with pytest.raises(InvalidArgument, match=r"must be > 0 (bytes/)?s and finite, got"):
        dataclasses.replace(RATES, **{field: wrong})


def test_rates_refuse_a_measurement_of_zero_from_the_gpu(monkeypatch, native_rates):
    monkeypatch.setattr(_native, "doorbell_round_trip", lambda device, rounds: 0.0)
    with pytest.raises(InvalidArgument, match="doorbell round trip must be > 0 s and finite, got 0.0"):
        bench_rates.measure(SimpleNamespace(read_bandwidth=lambda nbytes: 30e9), 0)


def test_the_native_measurements_refuse_empty_sizes_before_looking_for_a_gpu():
    with pytest.raises(InvalidArgument, match="pinned_upload_rate: bytes must be >= 1, got 0"):
        _native.pinned_upload_rate(0, 0)
    with pytest.raises(InvalidArgument, match="device_copy_rate: reps must be >= 1, got 0"):
        _native.device_copy_rate(0, 1 << 20, 0)
    with pytest.raises(InvalidArgument, match="doorbell_round_trip: rounds must be >= 1, got 0"):
        _native.doorbell_round_trip(0, 0)


@pytest.mark.gpu
def test_the_gpu_rates_are_positive_finite_and_sane():
    upload = _native.pinned_upload_rate(0, 64 << 20, 3)
    copy = _native.device_copy_rate(0, 64 << 20, 3)
    trip = _native.doorbell_round_trip(0, 200)
    assert 1e8 < upload < 1e12, upload  # PCIe or NVLink-C2C: 0.1 GB/s .. 1 TB/s
    assert 1e10 < copy < 1e14, copy  # HBM traffic: 10 GB/s .. 100 TB/s
    assert 1e-7 < trip < 1e-3, trip  # a bus round trip: over 100 ns, far under a millisecond
    assert math.isfinite(upload) and math.isfinite(copy) and math.isfinite(trip)
    assert upload < copy  # the host link is slower than the GPU's own memory, PCIe and C2C alike


def test_run_decodes_each_mode_and_writes_json(tiny, tmp_path, capsys, native_rates):
    opened = []

    def fake_session(context, kv, mode, kv_streaming=False, defer_experts=0):
        opened.append((context, kv, mode, defer_experts))
        return Session(GpuEngine(TimedFakeSession(mode.value)), codec=None)

    g = tiny.geometry
    model = SimpleNamespace(info=SimpleNamespace(geometry=g), file=tiny, session=fake_session, device=1,
                            pool=SimpleNamespace(read_bandwidth=lambda nbytes: 30e9), cache_slots=[2] * g.n_layer,
                            cache_bytes=3 << 20)
    out = tmp_path / "bench.json"
    result = run(model, model_path="tiny.gguf", modes=Mode.values(), prompt_tokens=4, tokens=8, kv="Q4",
                 json_path=str(out), defer_experts=1, emit=print)
    assert opened == [(13, KV.Q4, mode, 1) for mode in Mode]
    assert native_rates == [1, 1, 1] and result["rates"] == dataclasses.asdict(dataclasses.replace(RATES,
                                                                                                   host_read=30e9))
    assert result["limit"]["hbm_copy_rate"] == 4.2e12 and result["limit"]["doorbell_round_trip"] == 3.1e-6
    assert result["kv"] == "q4" and result["defer_experts"] == 1
    for mode in Mode.values():
        m = result["modes"][mode]
        assert math.isclose(m["ring_wait_seconds"], 1e-4) and math.isclose(m["pool_seconds"], 2e-4)
        parts = m["ring_wait_seconds"] + m["pool_seconds"] + m["host_other_seconds"]
        assert math.isclose(parts, m["seconds_per_token"], rel_tol=1e-9)
        assert math.isclose(m["fraction_of_limit"], result["limit"]["seconds"] / m["seconds_per_token"])
        assert math.isclose(m["expert_hit_rate"], 3 / 8) and m["expert_copies_per_token"] == 1
    assert json.loads(out.read_text()) == result
    text = capsys.readouterr().out
    assert "machine limit" in text and "measured device copy" in text and "token_graph" in text and "kv q4" in text
    assert "defer experts 1" in text
    assert "30.0 GB/s (CPU pool, measured here)" in text and "4.2 TB/s (measured device copy, measured here)" in text
    assert f"{g.n_layer} ringing layers x 3.1 us (round trip measured here)" in text


class NextDrafter:
    """Drafts t + 1, t + 2, ... after the last token t: what VerifyingEngine accepts, every draft."""

    def propose(self, history, k):
        return [(history[-1] + i) % 512 for i in range(1, k + 1)]


def test_a_tiered_runs_reads_are_the_decoded_tokens_own(tiny, monkeypatch, native_rates):
    """On a tiered load the limit's disk bytes are the timed tokens' reads: the prompt's steps (here ten misses
    each, against the decoded tokens' two) stay out of the per-token figures."""
    natives = []

    def fake_session(context, kv, mode, kv_streaming=False, defer_experts=0):
        natives.append(TimedFakeSession(mode.value))
        return Session(GpuEngine(natives[-1]), codec=None)

    def tier_stats():
        at = natives[-1].position if natives else 0
        misses = 10 * min(at, 4) + 2 * max(at - 4, 0)  # 4 prompt ids, then 2 misses a decoded token
        return [{"hits": 8 * at, "misses": misses, "bytes_read": misses * 1_000_000}]

    monkeypatch.setattr(bench_run, "disk_rate", lambda *args, **kwargs: DiskRate(1e9, "O_DIRECT"))
    g = tiny.geometry
    pool = SimpleNamespace(read_bandwidth=lambda nbytes: 30e9, tier_stats=tier_stats)
    model = SimpleNamespace(info=SimpleNamespace(geometry=g), file=tiny, session=fake_session, device=1, pool=pool,
                            cache_slots=[0] * g.n_layer, cache_bytes=0, ram=SimpleNamespace(tiered=True))
    result = run(model, model_path="tiny.gguf", modes=["token_graph"], prompt_tokens=4, tokens=8,
                 emit=lambda line: None)
    tier = result["modes"]["token_graph"]["tier"]
    assert (tier["misses_per_token"], tier["disk_bytes_per_token"]) == (2, 2_000_000)
    assert math.isclose(tier["disk_seconds"], 2e-3)


def test_run_with_drafts_opens_drafting_sessions_and_reports_their_acceptance(tiny, capsys, native_rates):
    opened = []

    def drafting_session(context, kv, mode, kv_streaming=False, defer_experts=0, draft=None, draft_tokens=None):
        opened.append((mode, draft, draft_tokens))
        return Session(VerifyingEngine(TimedFakeSession(mode.value)), SimpleNamespace(eos_ids=[], decode=str),
                       NextDrafter(), draft_tokens, draft_length=FixedDraftLength(draft_tokens))

    g = tiny.geometry
    model = SimpleNamespace(info=SimpleNamespace(geometry=g), file=tiny, session=drafting_session, device=1,
                            pool=SimpleNamespace(read_bandwidth=lambda nbytes: 30e9), cache_slots=[2] * g.n_layer,
                            cache_bytes=3 << 20)
    result = run(model, model_path="tiny.gguf", modes=["uncaptured"], prompt_tokens=4, tokens=8, draft="lookup",
                 draft_tokens=3, emit=print)
    assert opened == [(Mode.UNCAPTURED, "lookup", 3)] and (result["draft"], result["draft_tokens"]) == ("lookup", 3)
    m = result["modes"]["uncaptured"]
    assert (m["tokens"], m["acceptance_rate"], m["tokens_per_step"]) == (8, 1.0, 4.0)
    text = capsys.readouterr().out
    assert "; draft lookup, up to 3 per step" in text
    assert "uncaptured    8 tokens decoded, drafts accepted 100.0%, 4.00 tokens per step" in text
    with pytest.raises(InvalidArgument, match="draft_tokens must be in 1..7, got 8"):
        run(model, model_path="tiny.gguf", modes=["uncaptured"], prompt_tokens=4, tokens=8, draft="lookup",
            draft_tokens=8, emit=print)
    assert len(opened) == 1 and native_rates == [1, 1, 1]  # refused before the rates are measured


def test_the_report_says_the_rates_it_divided_by(tiny):
    g = tiny.geometry
    limit = machine_limit(g, _tensors(tiny), dataclasses.replace(RATES, hbm_copy=3.0e12, doorbell_round_trip=5e-6),
                          slots=[g.n_expert] + [0] * (g.n_layer - 1))
    result = {"model": "m.gguf", "arch": g.arch, "n_layer": g.n_layer, "prompt_tokens": 4, "tokens": 8, "kv": "int8",
              "expert_cache": "cache", "limit": {**dataclasses.asdict(limit), "seconds": limit.seconds}, "modes": {}}
    text = "\n".join(report(result))
    assert "at HBM 3.0 TB/s (measured device copy, measured here)" in text
    assert f"{g.n_layer - 1} ringing layers x 5.0 us (round trip measured here) = " \
           f"{(g.n_layer - 1) * 5e-3:.3f} ms" in text
    assert "at host read 20.0 GB/s (CPU pool, measured here)" in text


def test_the_report_sets_each_term_beside_its_bound(tiny):
    g = tiny.geometry
    limit = machine_limit(g, _tensors(tiny), RATES)
    mode = {"tokens_per_second": 100.0, "seconds_per_token": 0.01, "ring_wait_seconds": 0.002, "pool_seconds": 0.007,
            "gpu_pre_seconds": 0.0, "gpu_post_seconds": 0.0, "host_other_seconds": 0.001,
            "fraction_of_limit": limit.seconds / 0.01, "expert_hit_rate": 0.0}
    result = {"model": "m.gguf", "arch": g.arch, "n_layer": g.n_layer, "prompt_tokens": 4, "tokens": 8, "kv": "int8",
              "expert_cache": "none", "limit": {**dataclasses.asdict(limit), "seconds": limit.seconds},
              "modes": {"token_graph": mode}}
    text = " ".join(" ".join(report(result)).split())  # the columns' padding aside
    assert "token_graph: each term beside its bound" in text
    assert f"gpu before the rings 2.000 ms bound {limit.dense_seconds * 1e3:.3f} ms (dense bytes at HBM) " \
           f"{limit.dense_seconds / 0.002:.1%} of it; {2000 / g.n_layer:.1f} us per ringing layer" in text
    assert f"pool 7.000 ms bound {limit.routed_seconds * 1e3:.3f} ms (routed bytes at host read)" in text
    assert f"token 10.000 ms bound {limit.seconds * 1e3:.3f} ms (the limit)" in text
    # Every expert in VRAM: no layer rings, the whole token is the GPU's.
    cached = machine_limit(g, _tensors(tiny), RATES, slots=[g.n_expert] * g.n_layer)
    result["limit"] = {**dataclasses.asdict(cached), "seconds": cached.seconds}
    text = " ".join(" ".join(report(result)).split())
    assert "gpu before the rings" not in text
    assert f"gpu, the whole token 10.000 ms bound {cached.dense_seconds * 1e3:.3f} ms (dense and cached bytes at " \
           "HBM)" in text


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"modes": ["fast"]}, "unknown session mode"),
    ({"tokens": 0}, "--tokens must be >= 1"),
    ({"kv": "fp8"}, "unknown KV format 'fp8'; choose one of bf16, int8, k8v4, q4"),
])
def test_run_argument_errors(kwargs, fragment):
    args = {"modes": ["token_graph"], "prompt_tokens": 4, "tokens": 8, **kwargs}
    with pytest.raises(InvalidArgument, match=fragment):
        run(SimpleNamespace(), model_path="m.gguf", emit=print, **args)


def test_run_refuses_a_deferral_beyond_the_routed_experts_before_measuring(tiny):
    g = tiny.geometry
    model = SimpleNamespace(info=SimpleNamespace(geometry=g))  # no pool: the refusal comes first
    with pytest.raises(InvalidArgument, match=rf"defer_experts must be in 0..{g.n_expert_used - 1} "):
        run(model, model_path="m.gguf", modes=["token_graph"], prompt_tokens=4, tokens=8,
            defer_experts=g.n_expert_used, emit=print)


class FakePromptNative:
    """A native session that feeds prompts in fixed time per token, steps in fixed time per token, and stages
    fixed bytes per token fed."""

    def __init__(self, chunk: int):
        self.prompt_chunk, self.position, self.fed, self.closed = chunk, 0, [], False

    def feed(self, ids, rows, params, u, sample=True):
        self.fed.append(len(ids))
        self.position = len(ids)
        time.sleep(1e-4 * len(ids))
        return 1

    def step(self, token, rows, params, u, sample=True):
        self.position += 1
        time.sleep(1e-3)
        return 1 if sample else -1

    def reset(self):
        self.position = 0

    def stats(self):
        return {"prompt_staged_bytes": 55_000_000 * self.position}  # 1 ms of PCIe per token

    def close(self):
        self.closed = True


def test_prompt_speed_times_every_length_beside_stepping(tiny):
    engines = []

    def fake_session(context, kv, snapshots, prompt_chunk=None, kv_streaming=False):
        engines.append(FakePromptNative(0 if prompt_chunk == 0 else 64))
        return Session(GpuEngine(engines[-1]), codec=None)

    model = SimpleNamespace(info=SimpleNamespace(geometry=tiny.geometry), session=fake_session)
    rows = prompt_speed(model, [8, 100], KV.INT8, np.random.default_rng(0), upload_rate=55e9)
    chunked, stepped = engines
    assert chunked.fed == [64, 8, 100] and all(e.closed for e in engines)  # a warm-up, then each length
    assert stepped.fed == [] and stepped.position == 64  # stepped token by token: the first 64 of 100
    assert [r["tokens"] for r in rows] == [8, 100] and all(r["chunk"] == 64 for r in rows)
    for r in rows:
        assert r["staged_bytes"] == 55_000_000 * r["tokens"]
        assert math.isclose(r["pcie_floor_seconds"], 1e-3 * r["tokens"])
        assert math.isclose(r["fraction_of_limit"], r["pcie_floor_seconds"] / r["seconds"])
        assert r["tokens_per_second"] > r["stepped_tokens_per_second"]  # 0.1 ms per token fed, 1 ms stepped
    text = "\n".join(prompt_report(rows))
    assert "ttft" in text and "PCIe floor" in text and "chunk 64" in text
    assert "PCIe 55.0 GB/s measured here" in text


def test_prompt_speed_refuses_a_model_without_a_prompt_path(tiny):
    natives = []

    def no_prompt_path(context, kv, snapshots, prompt_chunk=None, kv_streaming=False):
        natives.append(FakePromptNative(0))
        return Session(GpuEngine(natives[-1]), codec=None)

    model = SimpleNamespace(info=SimpleNamespace(geometry=tiny.geometry), session=no_prompt_path)
    with pytest.raises(InvalidArgument, match="no prompt path"):
        prompt_speed(model, [8], KV.INT8, np.random.default_rng(0), upload_rate=55e9)
    assert natives and all(n.closed for n in natives)
