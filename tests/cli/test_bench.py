"""`strata bench` on the CPU: the limit arithmetic, the cache rules, the report, a run over a fake session."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from strata.cli import bench
from strata.errors import InvalidArgument
from strata.format import inspect
from strata.options import KV, Mode
from strata.runtime.engine import GpuEngine
from strata.synth import synthesize


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
    limit = bench.machine_limit(g, _tensors(tiny), read_bandwidth=20e9)
    assert (limit.routed_bytes, limit.dense_bytes) == (routed, dense)
    expected = routed / 20e9 + dense / 4.2e12 + g.n_layer * 3.1e-6
    assert math.isclose(limit.seconds, expected, rel_tol=1e-12), (limit, expected)  # same sums, other order
    with pytest.raises(InvalidArgument, match="read bandwidth must be > 0"):
        bench.machine_limit(g, _tensors(tiny), 0.0)


def test_the_limit_moves_cached_experts_to_hbm_and_drops_their_doorbells(tiny):
    g = tiny.geometry
    pool_only = bench.machine_limit(g, _tensors(tiny), read_bandwidth=20e9)
    slots = [g.n_expert] + [g.n_expert // 2] * (g.n_layer - 1)  # the first layer whole, the others half
    cached = bench.machine_limit(g, _tensors(tiny), read_bandwidth=20e9, slots=slots)
    per_layer = pool_only.routed_bytes / g.n_layer
    held = per_layer * (1 + (g.n_layer - 1) / 2)
    assert math.isclose(cached.cached_bytes, held, abs_tol=1) and cached.routed_bytes + cached.cached_bytes == \
        pool_only.routed_bytes
    assert cached.dense_bytes == pool_only.dense_bytes + cached.cached_bytes
    assert math.isclose(cached.doorbell_seconds, (g.n_layer - 1) * 3.1e-6)
    everything = bench.machine_limit(g, _tensors(tiny), 20e9, slots=[g.n_expert] * g.n_layer)
    assert everything.routed_bytes == 0 and everything.doorbell_seconds == 0


def test_cache_dir_rules(tmp_path):
    assert bench.cache_dir({"STRATA_CACHE": "/c", "XDG_CACHE_HOME": "/x"}) == Path("/c")
    assert bench.cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/strata")
    assert bench.cache_dir({"STRATA_CACHE": "", "XDG_CACHE_HOME": ""}) == Path.home() / ".cache" / "strata"


def test_bench_model_is_written_under_a_temp_name_then_reused(tmp_path, capsys):
    calls = []

    def fake_synth(path, arch, **kwargs):
        calls.append((Path(path), arch, kwargs))
        assert not (tmp_path / "cache" / "qwen4exp-bench-16L.gguf").exists(), "the final name appears only when done"
        Path(path).write_bytes(b"GGUF model")

    cache = tmp_path / "cache"
    path = bench.bench_model(cache, fake_synth)
    assert path == cache / "qwen4exp-bench-16L.gguf" and path.read_bytes() == b"GGUF model"
    (written, arch, kwargs) = calls[0]
    assert written != path and written.parent == cache and arch == "qwen4exp"
    assert kwargs["preset"] == "bench" and kwargs["n_layer"] == 16
    assert "synthesizing the default benchmark model" in capsys.readouterr().err
    assert bench.bench_model(cache, fake_synth) == path and len(calls) == 1  # reused, not synthesized again
    assert sorted(p.name for p in cache.iterdir()) == [path.name]


def test_an_interrupted_synth_leaves_nothing_that_would_be_reused(tmp_path):
    def failing_synth(path, arch, **kwargs):
        Path(path).write_bytes(b"half a model")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        bench.bench_model(tmp_path, failing_synth)
    assert list(tmp_path.iterdir()) == []


def test_prompt_ids_avoid_the_ple_eos(tiny, rng):
    g = tiny.geometry
    ids = bench.prompt_ids(g, 2000, rng)
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


def test_run_decodes_each_mode_and_writes_json(tiny, tmp_path, capsys):
    opened = []

    def fake_session(context, kv, mode, kv_streaming=False, defer_experts=0):
        opened.append((context, kv, mode, defer_experts))
        return SimpleNamespace(engine=GpuEngine(TimedFakeSession(mode.value)))

    g = tiny.geometry
    model = SimpleNamespace(info=SimpleNamespace(geometry=g), file=tiny, session=fake_session,
                            pool=SimpleNamespace(read_bandwidth=lambda nbytes: 30e9), cache_slots=[2] * g.n_layer)
    out = tmp_path / "bench.json"
    result = bench.run(model, model_path="tiny.gguf", modes=Mode.values(), prompt_tokens=4, tokens=8, kv="Q4",
                       json_path=str(out), defer_experts=1)
    assert opened == [(13, KV.Q4, mode, 1) for mode in Mode]
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


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"modes": ["fast"]}, "unknown session mode"),
    ({"tokens": 0}, "--tokens must be >= 1"),
    ({"kv": "fp8"}, "unknown KV format 'fp8'; choose one of bf16, int8, k8v4, q4"),
])
def test_run_argument_errors(kwargs, fragment):
    args = {"modes": ["token_graph"], "prompt_tokens": 4, "tokens": 8, **kwargs}
    with pytest.raises(InvalidArgument, match=fragment):
        bench.run(SimpleNamespace(), model_path="m.gguf", **args)


def test_run_refuses_a_deferral_beyond_the_routed_experts_before_measuring(tiny):
    g = tiny.geometry
    model = SimpleNamespace(info=SimpleNamespace(geometry=g))  # no pool: the refusal comes first
    with pytest.raises(InvalidArgument, match=rf"defer_experts must be in 0..{g.n_expert_used - 1} "):
        bench.run(model, model_path="m.gguf", modes=["token_graph"], prompt_tokens=4, tokens=8,
                  defer_experts=g.n_expert_used)


class FakePromptEngine:
    """A GPU engine whose native session feeds prompts in fixed time per token and stages fixed bytes."""

    def __init__(self, chunk: int):
        self.native = SimpleNamespace(prompt_chunk=chunk, feed=self._feed)
        self.ple, self.position, self.fed, self.closed = None, 0, [], False

    def _feed(self, ids, rows, params, u):
        self.fed.append(len(ids))
        self.position = len(ids)
        time.sleep(1e-4 * len(ids))
        return 1

    def prefill(self, ids, seen):
        time.sleep(1e-3 * len(ids))

    def reset(self):
        self.position = 0

    def stats(self):
        return {"prompt_staged_bytes": 55_000_000 * self.position}  # 1 ms of PCIe per token

    def close(self):
        self.closed = True


def test_prompt_speed_times_every_length_beside_stepping(tiny):
    engines = []

    def fake_session(context, kv, snapshots, prompt_chunk=None, kv_streaming=False):
        engines.append(FakePromptEngine(0 if prompt_chunk == 0 else 64))
        return SimpleNamespace(engine=engines[-1])

    model = SimpleNamespace(info=SimpleNamespace(geometry=tiny.geometry), session=fake_session)
    rows = bench.prompt_speed(model, [8, 100], KV.INT8, np.random.default_rng(0))
    chunked, stepped = engines
    assert chunked.fed == [64, 8, 100] and all(e.closed for e in engines)  # a warm-up, then each length
    assert [r["tokens"] for r in rows] == [8, 100] and all(r["chunk"] == 64 for r in rows)
    for r in rows:
        assert r["staged_bytes"] == 55_000_000 * r["tokens"]
        assert math.isclose(r["pcie_floor_seconds"], 1e-3 * r["tokens"])
        assert math.isclose(r["fraction_of_limit"], r["pcie_floor_seconds"] / r["seconds"])
        assert r["tokens_per_second"] > r["stepped_tokens_per_second"]  # 0.1 ms per token fed, 1 ms stepped
    text = "\n".join(bench.prompt_report(rows))
    assert "ttft" in text and "PCIe floor" in text and "chunk 64" in text


def test_prompt_speed_refuses_a_model_without_a_prompt_path(tiny):
    def no_prompt_path(context, kv, snapshots, prompt_chunk=None, kv_streaming=False):
        return SimpleNamespace(engine=FakePromptEngine(0))

    model = SimpleNamespace(info=SimpleNamespace(geometry=tiny.geometry), session=no_prompt_path)
    with pytest.raises(InvalidArgument, match="no prompt path"):
        bench.prompt_speed(model, [8], KV.INT8, np.random.default_rng(0))
