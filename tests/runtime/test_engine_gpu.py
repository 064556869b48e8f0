"""The GPU engine end to end on a tiny synthetic model (needs a CUDA device and the native DecodeSession)."""

from __future__ import annotations

import json
import math

import pytest

from strata import cli
from strata.options import Mode
from strata.synth import synthesize

pytestmark = pytest.mark.gpu
# Experts in q8_0 (whole 32-blocks in every tiny expert matrix): the quantized path of the CPU pool.
EXPERT_TYPES = {"experts": "q8_0", "expert_down": "q8_0"}


@pytest.fixture(scope="module", params=["qwen4exp", "qwen3next", "qwen35moe"])
def tiny_model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu") / f"{request.param}.gguf"
    synthesize(path, request.param, types=EXPERT_TYPES, seed=11)
    return path


PROMPT, N = "hello strata", 16


def _native_greedy(model, ids: list[int], n: int) -> list[int]:
    """n greedy tokens after `ids` from a DecodeSession driven directly (no generation.Session, no GpuEngine), the
    prompt fed as the GPU engine feeds it: through the prompt path in the session's chunk where the prompt is long
    enough (PROMPT_MIN_TOKENS), else token by token.

    Tokens are compared GPU to GPU: the same kernels in the same order give the same logits, so equality is exact.
    Agreement with the reference is tests/session/test_decode_session.py's job, with a tolerance (near-ties of a
    random tiny model's logits can flip a greedy token between two correct implementations, as between the prompt
    path's products and the steps' GEMVs).
    """
    from strata.runtime.ple_rows import PleRows
    from strata.runtime.prompt import PROMPT_MIN_TOKENS
    from support.native_session import open_native_session

    probe = model.session(context=256, kv="int8")
    chunk = probe.engine.prompt_chunk
    probe.close()
    g = model.info.geometry
    gather = PleRows(model.file, g) if g.ple_layers else None  # one n-gram state for the prompt and the steps
    ple = gather.rows if gather else (lambda token: None)
    native = open_native_session(model, context=256, kv="int8", mode="uncaptured", cache=model.cache,
                                 prompt_chunk=chunk, staging=model.staging)
    greedy = (0.0, 0, 1.0, 0.0, 1.0)
    try:
        if chunk and len(ids) >= PROMPT_MIN_TOKENS:
            token = native.feed(ids, gather.rows_for(ids) if gather else None, greedy, 0.0, sample=True)
        else:
            for i, t in enumerate(ids):
                token = native.step(t, ple(t), greedy, 0.0, sample=i == len(ids) - 1)
        out = []
        for _ in range(n):
            out.append(token)
            token = native.step(token, ple(token), greedy, 0.0)
        return out
    finally:
        native.close()


class _Replay:
    """A generation.Engine that returns given tokens: the text generation.Session streams for them."""

    def __init__(self, tokens: list[int]):
        self.tokens, self.context, self.position = list(tokens), 1 << 20, 0

    def feed(self, ids, params, u, seen):
        self.position += len(ids)
        return self.tokens.pop(0)

    def reset(self):
        self.position = 0


@pytest.fixture(scope="module")
def expected(tiny_model):
    """The GPU's greedy tokens for PROMPT, and the text generation.Session streams for them."""
    from strata.generation import Session
    from strata.runtime.model import load

    with load(tiny_model, progress=False) as model:
        tokenizer = model.file.tokenizer()
        tokens = _native_greedy(model, tokenizer.encode(PROMPT), N)
    text = "".join(piece.text for piece in Session(_Replay(tokens), tokenizer).generate(PROMPT, N))
    return tokens, text


@pytest.mark.parametrize("mode", list(Mode))
def test_gpu_engine_generates_the_native_sessions_tokens(tiny_model, expected, mode):
    from strata.runtime.model import load

    with load(tiny_model, progress=False) as model:
        session = model.session(context=256, kv="int8", mode=mode)
        try:
            got = [piece.token for piece in session.generate(PROMPT, N)]
            stats = session.engine.stats()
        finally:
            session.engine.close()
    assert got == expected[0], f"mode {mode}: engine {got} vs native {expected[0]}"
    assert stats["tokens"] >= len(got) and stats["seconds"] > 0


def test_strata_run_prints_the_generated_text(tiny_model, expected, capsys):
    assert cli.main(["run", str(tiny_model), "-p", PROMPT, "-n", str(N), "--engine", "gpu"]) == 0
    captured = capsys.readouterr()
    assert captured.out == expected[1] + "\n"
    assert "engine: gpu (token_graph, kv int8)" in captured.err and "load: dense weights" in captured.err


def test_strata_bench_writes_json(tiny_model, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert cli.main(["bench", str(tiny_model), "--tokens", "8", "--prompt-tokens", "4", "--json", str(out)]) == 0
    assert "machine limit" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert sorted(result["modes"]) == sorted(Mode.values())
    for mode, m in result["modes"].items():
        assert math.isfinite(m["tokens_per_second"]) and m["tokens_per_second"] > 0, (mode, m)
    assert result["limit"]["seconds"] > 0
    assert sorted(result["rates"]) == ["doorbell_round_trip", "hbm_copy", "host_read", "pcie_upload"]
    assert all(math.isfinite(v) and v > 0 for v in result["rates"].values()), result["rates"]


def test_a_converted_checkpoint_runs_from_the_cli(tmp_path, capsys):
    """The README's path: a transformers checkpoint -> strata convert -> strata run on the GPU."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from support.hf_models import random_model

    random_model("qwen4exp", 0, seed=3).save_pretrained(tmp_path / "hf")
    out = tmp_path / "model.gguf"
    # q8_0: the CPU pool computes quantized experts only
    assert cli.main(["convert", str(tmp_path / "hf"), str(out), "--outtype", "q8_0"]) == 0
    assert cli.main(["run", str(out), "-p", PROMPT, "-n", "12"]) == 0
    err = capsys.readouterr().err
    assert "tok/s decode" in err and "engine: gpu" in err, err


def test_the_quick_start_synth_then_chat_runs_on_the_gpu(tmp_path, monkeypatch, capsys):
    """README: `strata synth tiny.gguf && strata chat tiny.gguf`, two turns piped in."""
    import io
    import sys

    path = tmp_path / "tiny.gguf"
    assert cli.main(["synth", str(path)]) == 0
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\nand again\n/exit\n"))
    assert cli.main(["chat", str(path), "-n", "6"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{path}\n(/exit or Ctrl-D leaves") and out.count("> ") == 3, out
