"""The GPU engine end to end on a tiny synthetic model (needs a CUDA device and the native DecodeSession)."""

from __future__ import annotations

import json
import math

import pytest

from strata import cli
from strata.engine import MODES
from strata.synth import synthesize

pytestmark = pytest.mark.gpu
# The CPU pool takes quantized forms only: experts in q8_0 (whole 32-blocks in every tiny expert matrix).
EXPERT_TYPES = {"experts": "q8_0", "expert_down": "q8_0"}


@pytest.fixture(scope="module", params=["qwen4exp", "qwen3next", "qwen35moe"])
def tiny_model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu") / f"{request.param}.gguf"
    synthesize(path, request.param, types=EXPERT_TYPES, seed=11)
    return path


def _reference(path, prompt: str, n: int) -> tuple[list[int], str]:
    """The greedy tokens and streamed text of the q8_32 reference."""
    from strata.format import inspect
    from strata.generation import Session
    from strata.reference import Reference
    from strata.reference.engine import ReferenceEngine

    with inspect(path) as file:
        # activation_quant: every product on q8_32 activations, the contract the GPU kernels and pool follow.
        session = Session(ReferenceEngine(Reference(file, activation_quant=True)), file.tokenizer())
        pieces = list(session.generate(prompt, n))
        return [piece.token for piece in pieces], "".join(piece.text for piece in pieces)


@pytest.mark.parametrize("mode", MODES)
def test_gpu_engine_generates_the_reference_tokens(tiny_model, mode):
    from strata.model import load

    expected, _ = _reference(tiny_model, "hello strata", 16)
    with load(tiny_model, progress=False) as model:
        session = model.session(context=256, mode=mode)
        try:
            got = [piece.token for piece in session.generate("hello strata", 16)]
            stats = session.engine.stats()
        finally:
            session.engine.close()
    assert got == expected, f"mode {mode}: gpu {got} vs reference {expected}"
    assert stats["tokens"] >= len(got) and stats["seconds"] > 0


def test_strata_run_prints_the_reference_text(tiny_model, capsys):
    _, expected = _reference(tiny_model, "hello strata", 16)
    assert cli.main(["run", str(tiny_model), "-p", "hello strata", "-n", "16", "--engine", "gpu"]) == 0
    captured = capsys.readouterr()
    assert captured.out == expected + "\n"
    assert "engine: gpu (token_graph, kv int8)" in captured.err and "load: dense weights" in captured.err


def test_strata_bench_writes_json(tiny_model, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert cli.main(["bench", str(tiny_model), "--tokens", "8", "--prompt-tokens", "4", "--json", str(out)]) == 0
    assert "machine limit" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert sorted(result["modes"]) == sorted(MODES)
    for mode, m in result["modes"].items():
        assert math.isfinite(m["tokens_per_second"]) and m["tokens_per_second"] > 0, (mode, m)
    assert result["limit"]["seconds"] > 0
