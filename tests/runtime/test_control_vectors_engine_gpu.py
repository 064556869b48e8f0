"""Control vectors through the GPU engine's API and command line (needs a CUDA device): Model.session's
control_vectors and control_layers in every mode, Session.set_control_vectors between calls, `strata run`, `strata
bench` and `strata cvector --engine gpu` on a tiny synthetic model of each architecture."""

from __future__ import annotations

import json

import numpy as np
import pytest

from strata import cli
from strata.control_vectors import read_control_vector, write_control_vector
from strata.options import Mode
from strata.synth import synthesize

pytestmark = pytest.mark.gpu
EXPERT_TYPES = {"experts": "q8_0", "expert_down": "q8_0"}
PROMPT, N = "hello strata, steer me", 12


@pytest.fixture(scope="module", params=["qwen4exp", "qwen3next", "qwen35moe"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("steer") / f"{request.param}.gguf"
    synthesize(path, request.param, types=EXPERT_TYPES, seed=11)
    return path


@pytest.fixture(scope="module")
def vector(tiny, tmp_path_factory):
    """A control vector of every layer 1.. of the model, 0.3 of the streams' RMS per value."""
    from strata.format import inspect

    with inspect(tiny) as file:
        g = file.geometry
    rng = np.random.default_rng(7)
    path = tmp_path_factory.mktemp("vectors") / "v.gguf"
    write_control_vector(path, {n: (rng.standard_normal(g.n_embd) * 0.3).astype(np.float32)
                                for n in range(1, g.n_layer)}, g.arch)
    return path


def greedy(session, prompt=PROMPT, n=N):
    return [piece.token for piece in session.generate(prompt, n)]


def test_model_sessions_steer_alike_in_every_mode(tiny, vector):
    from strata.runtime.model import load

    with load(tiny, progress=False) as model:
        n_layer = model.info.geometry.n_layer
        runs = {}
        for mode in Mode:
            with model.session(256, mode=mode, prompt_cpu=False, control_vectors=[(vector, 1.0)],
                               control_layers=(1, 2)) as session:
                assert session.engine.steered_layers == [1, 2]
                runs[mode] = greedy(session)
        assert runs[Mode.LAYER_GRAPHS] == runs[Mode.TOKEN_GRAPH] == runs[Mode.UNCAPTURED], runs
        # the pool's share of a small chunk's experts off: a token's experts run on the GPU in every session
        with model.session(256, prompt_cpu=False) as plain, \
                model.session(256, prompt_cpu=False, control_vectors=[(vector, 0.0)]) as zero:
            # a zero scale: every direction zero, the logits none's bit for bit
            assert zero.engine.steered_layers == list(range(1, n_layer))
            assert greedy(plain) == greedy(zero)
            assert np.array_equal(plain.engine.logits(), zero.engine.logits())


def test_a_session_changes_its_vectors_between_calls(tiny, vector):
    from strata.runtime.model import load

    with load(tiny, progress=False) as model:
        with model.session(256, mode=Mode.TOKEN_GRAPH, prompt_cpu=False) as session, \
                model.session(256, mode=Mode.UNCAPTURED, prompt_cpu=False) as twin:
            for s in (session, twin):
                greedy(s, n=4)
            assert session.graphs.captured
            for s in (session, twin):
                s.set_control_vectors([(vector, 2.0)], (2, 3))
            assert session.engine.steered_layers == [2, 3] and not session.graphs.captured  # recaptured next
            got, want = greedy(session, PROMPT + " more", 6), greedy(twin, PROMPT + " more", 6)
            assert got == want and np.array_equal(session.engine.logits(), twin.engine.logits())
            for s in (session, twin):
                s.set_control_vectors([(vector, -1.0)], (2, 3))  # new values, the same layers: the graphs stay
            assert session.graphs.captured
            assert greedy(session, PROMPT + " again", 6) == greedy(twin, PROMPT + " again", 6)
            assert np.array_equal(session.engine.logits(), twin.engine.logits())
            for s in (session, twin):
                s.set_control_vectors()
            assert session.engine.steered_layers == []


def test_strata_run_and_bench_take_the_flags_on_the_gpu(tiny, vector, tmp_path, capsys):
    assert cli.main(["run", str(tiny), "-p", PROMPT, "-n", "4", "--control-vector-scaled", str(vector), "1.5",
                     "--control-vector-layer-range", "1", "2"]) == 0
    assert "engine: gpu" in capsys.readouterr().err
    out = tmp_path / "bench.json"
    assert cli.main(["bench", str(tiny), "--tokens", "4", "--prompt-tokens", "4", "--mode", "token_graph",
                     "--control-vector", str(vector), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["control_vectors"] == [[str(vector), 1.0]] and result["control_layers"] is None
    assert result["modes"]["token_graph"]["tokens_per_second"] > 0


def test_strata_cvector_on_the_gpu_gives_the_references_vector(tiny, tmp_path, capsys):
    from strata.format import inspect

    rng = np.random.default_rng(5)
    with inspect(tiny) as file:
        tokenizer, g = file.tokenizer(), file.geometry
    texts = [" ".join(tokenizer.decode(rng.integers(0, g.n_vocab, 8).tolist()).split()) or "x" for _ in range(8)]
    (tmp_path / "pos.txt").write_text("\n".join(texts[:4]) + "\n")
    (tmp_path / "neg.txt").write_text("\n".join(texts[4:]) + "\n")
    files = {}
    for engine in ("gpu", "reference"):
        files[engine] = tmp_path / f"{engine}.gguf"
        assert cli.main(["cvector", str(tiny), "--positive", str(tmp_path / "pos.txt"), "--negative",
                         str(tmp_path / "neg.txt"), "-o", str(files[engine]), "--engine", engine]) == 0
        err = capsys.readouterr().err
        assert f"strata cvector: engine {engine}" in err and "of 8 prompts run" in err
    gpu, ref = (read_control_vector(files[e]).directions for e in ("gpu", "reference"))
    assert sorted(gpu) == sorted(ref) == list(range(1, g.n_layer))
    for layer in ref:
        # unit vectors; the GPU quantizes the activations of its q8_0 experts where this reference does not
        cosine = float(np.dot(gpu[layer].astype(np.float64), ref[layer].astype(np.float64)))
        print(f"{g.arch} layer {layer}: cosine {cosine:.5f}")
        assert cosine > 0.98, (g.arch, layer, cosine)
