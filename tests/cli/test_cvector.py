"""`strata cvector` and the control-vector flags of run, chat, serve and bench (docs/control_vectors.md)."""

from __future__ import annotations

import importlib
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from strata import cli
from strata.cli.session import control_vectors
from strata.control_vectors import make_control_vector, read_control_vector, reference_states, steering_table
from strata.control_vectors.make import last_token_states
from strata.errors import InvalidArgument
from strata.format import inspect
from strata.reference import Reference

PAIRS = 4
SCALE = 2.0  # times the unit vector on every layer (measured over 36 fresh seeds: a rise of 0.01 to 0.07)


def random_prompts(tokenizer, n_vocab: int, rng: np.random.Generator, count: int) -> list[str]:
    texts = (tokenizer.decode(rng.integers(0, n_vocab, 6).tolist()) for _ in range(count))
    return [" ".join(text.split()) or "x" for text in texts]  # one line each, none empty


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


@pytest.mark.parametrize("arch", ["qwen4exp", "qwen3next", "qwen35moe"])
def test_cvector_writes_a_file_that_loads_and_steers_toward_the_positive_prompts(
        arch: str, tiny_model, tmp_path: Path, rng: np.random.Generator, capsys) -> None:
    """Criterion: after each negative prompt, the mean log-probability of the positive prompts' continuations
    (their mean next-token distribution, unsteered) rises when the vector is applied at SCALE."""
    path = tiny_model(arch, seed=5)
    with inspect(path) as model_file:
        g, tokenizer = model_file.geometry, model_file.tokenizer()
        positive = random_prompts(tokenizer, g.n_vocab, rng, PAIRS)
        negative = random_prompts(tokenizer, g.n_vocab, rng, PAIRS)
        (tmp_path / "pos.txt").write_text("\n".join(positive) + "\n\n")  # an empty line is skipped
        (tmp_path / "neg.txt").write_text("\n".join(negative) + "\n")
        out = tmp_path / "steer.gguf"
        assert cli.main(["cvector", str(path), "--positive", str(tmp_path / "pos.txt"), "--negative",
                         str(tmp_path / "neg.txt"), "-o", str(out), "--engine", "reference"]) == 0
        assert capsys.readouterr().out.strip() == str(out)

        written = read_control_vector(out)
        assert (written.model_hint, written.layer_count, sorted(written.directions)) == (
            arch, g.n_layer - 1, list(range(1, g.n_layer)))
        for vector in written.directions.values():
            assert abs(np.linalg.norm(vector.astype(np.float64)) - 1) < 1e-6

        def next_token(text: str, steering=None) -> np.ndarray:
            reference = Reference(model_file, control_vectors=steering)
            return log_softmax(reference.forward(tokenizer.encode(text, special=True))[-1])

        target = np.mean([np.exp(next_token(text)) for text in positive], axis=0)
        steering = steering_table([(out, SCALE)], g)
        plain = np.mean([target @ next_token(text) for text in negative])
        steered = np.mean([target @ next_token(text, steering) for text in negative])
        print(f"{arch}: mean log-prob of the positive continuations {plain:.4f} -> {steered:.4f}")
        assert np.isfinite(steered) and steered > plain


def test_pca_of_one_pair_is_its_difference(tiny_model, rng: np.random.Generator) -> None:
    with inspect(tiny_model("qwen4exp", seed=5)) as model_file:
        tokenizer, g = model_file.tokenizer(), model_file.geometry
        pair = [tuple(random_prompts(tokenizer, g.n_vocab, rng, 2))]
        mean = make_control_vector(Reference(model_file), tokenizer, pair, "mean")
        pca = make_control_vector(Reference(model_file), tokenizer, pair, "pca")
    for layer in mean:
        assert np.allclose(pca[layer], mean[layer], rtol=0, atol=1e-5), layer


def test_cvector_refuses_unpaired_prompts_and_an_existing_output(tiny_model, tmp_path: Path, capsys) -> None:
    path = tiny_model("qwen3next", seed=5)
    (tmp_path / "pos.txt").write_text("a\nb\n")
    (tmp_path / "neg.txt").write_text("c\n")
    base = ["cvector", str(path), "--positive", str(tmp_path / "pos.txt"), "-o", str(tmp_path / "o.gguf"), "--engine",
            "reference"]
    assert cli.main([*base, "--negative", str(tmp_path / "neg.txt")]) == 1
    assert "2 positive prompts and 1 negative ones" in capsys.readouterr().err
    (tmp_path / "neg.txt").write_text("c\nd\n")
    (tmp_path / "o.gguf").write_text("taken")
    assert cli.main([*base, "--negative", str(tmp_path / "neg.txt")]) == 1
    assert "o.gguf" in capsys.readouterr().err and (tmp_path / "o.gguf").read_text() == "taken"


@pytest.mark.parametrize("command", [["run", "m.gguf", "-p", "x"], ["chat", "m.gguf"], ["serve", "m.gguf"],
                                     ["bench", "m.gguf"]])
def test_the_control_vector_flags_parse_as_llamacpps(command: list[str]) -> None:
    args = cli.parse_args([*command, "--control-vector", "a.gguf", "--control-vector-scaled", "b.gguf", "-0.5",
                           "--control-vector", "c.gguf", "--control-vector-layer-range", "2", "5"])
    assert control_vectors(args) == {"control_vectors": [("a.gguf", 1.0), ("c.gguf", 1.0), ("b.gguf", -0.5)],
                                     "control_layers": (2, 5)}
    assert control_vectors(cli.parse_args(command)) == {"control_vectors": [], "control_layers": None}
    with pytest.raises(InvalidArgument, match="SCALE must be a number"):
        control_vectors(cli.parse_args([*command, "--control-vector-scaled", "b.gguf", "strong"]))


def test_run_on_the_reference_applies_a_vector_made_by_cvector(tiny_model, tmp_path: Path, capsys) -> None:
    path = tiny_model("qwen3next", seed=5)
    (tmp_path / "pos.txt").write_text("hello\n")
    (tmp_path / "neg.txt").write_text("world\n")
    out = str(tmp_path / "v.gguf")
    assert cli.main(["cvector", str(path), "--positive", str(tmp_path / "pos.txt"), "--negative",
                     str(tmp_path / "neg.txt"), "-o", out, "--method", "pca", "--engine", "reference"]) == 0
    run = ["run", str(path), "-p", "hello", "-n", "2", "--engine", "reference", "--control-vector-scaled", out, "3"]
    assert cli.main([*run, "--control-vector-layer-range", "1", "2"]) == 0
    assert "engine: reference" in capsys.readouterr().err
    assert cli.main([*run, "--control-vector-layer-range", "9", "9"]) == 1
    assert "--control-vector-layer-range (9, 9): start is past the model's last layer" in capsys.readouterr().err


def write_prompts(tmp_path: Path, positive: list[str], negative: list[str]) -> list[str]:
    (tmp_path / "pos.txt").write_text("\n".join(positive) + "\n")
    (tmp_path / "neg.txt").write_text("\n".join(negative) + "\n")
    return ["--positive", str(tmp_path / "pos.txt"), "--negative", str(tmp_path / "neg.txt")]


def test_cvector_measures_on_the_reference_where_there_is_no_gpu(tiny_model, tmp_path: Path, monkeypatch,
                                                                 capsys) -> None:
    path = tiny_model("qwen3next", seed=5)
    prompts = write_prompts(tmp_path, ["hello there"], ["good bye"])
    monkeypatch.setattr(importlib.import_module("strata.devices"), "device_count", lambda: 0)  # no GPU anywhere
    out = tmp_path / "auto.gguf"
    assert cli.main(["cvector", str(path), *prompts, "-o", str(out)]) == 0
    assert "strata cvector: engine reference" in capsys.readouterr().err
    assert read_control_vector(out).directions
    assert cli.main(["cvector", str(path), *prompts, "-o", str(tmp_path / "gpu.gguf"), "--engine", "gpu"]) == 1
    assert "no CUDA device found" in capsys.readouterr().err and not (tmp_path / "gpu.gguf").exists()


class _StatesOnly:
    """A GPU model as `strata cvector --engine gpu` uses one, whose engine's layer states are the reference's
    (float32, as the native session returns them): what the command does around the GPU, without one."""

    def __init__(self, model_file, asked: dict):
        self.file, self.asked = model_file, asked
        self.tokenizer = model_file.tokenizer()
        self.info = SimpleNamespace(geometry=model_file.geometry)

    def session(self, context, **options):
        self.asked.update(context=context, **options)
        reference = Reference(self.file)
        engine = SimpleNamespace(prompt_chunk=16, layer_states=lambda ids: last_token_states(reference, ids)
                                 .astype(np.float32))
        return nullcontext(SimpleNamespace(engine=engine))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def test_cvector_on_the_gpu_engine_writes_what_the_reference_measures(tiny_model, tmp_path: Path, monkeypatch,
                                                                     capsys) -> None:
    """One stream (qwen3next): the states are float32 values either way, so the files are the same bit for bit."""
    path = tiny_model("qwen3next", seed=5)
    prompts = write_prompts(tmp_path, ["hello there", "a b c d e f"], ["good bye", "x"])
    asked: dict = {}
    monkeypatch.setattr("strata.cli.session.require_gpu", lambda hint: None)
    monkeypatch.setattr("strata.api.load", lambda model, engine: _StatesOnly(inspect(model), asked))
    for method in ("mean", "pca"):
        gpu, ref = tmp_path / f"gpu-{method}.gguf", tmp_path / f"ref-{method}.gguf"
        assert cli.main(["cvector", str(path), *prompts, "-o", str(gpu), "--engine", "gpu", "--method", method]) == 0
        assert "strata cvector: engine gpu" in capsys.readouterr().err
        assert cli.main(["cvector", str(path), *prompts, "-o", str(ref), "--engine", "reference", "--method",
                         method]) == 0
        assert gpu.read_bytes() == ref.read_bytes(), method
    with inspect(path) as model_file:
        tokenizer = model_file.tokenizer()
        longest = max(len(tokenizer.encode(p, special=True)) for p in ("hello there", "a b c d e f", "good bye", "x"))
    assert asked == {"context": longest, "kv": "bf16", "snapshots": 0}


def test_cvector_on_a_gpu_load_without_a_prompt_path_says_to_use_the_reference(tiny_model, tmp_path: Path,
                                                                              monkeypatch, capsys) -> None:
    path = tiny_model("qwen3next", seed=5)
    prompts = write_prompts(tmp_path, ["hello"], ["bye"])

    class NoPromptPath(_StatesOnly):
        def session(self, context, **options):
            return nullcontext(SimpleNamespace(engine=SimpleNamespace(prompt_chunk=0)))

    monkeypatch.setattr("strata.cli.session.require_gpu", lambda hint: None)
    monkeypatch.setattr("strata.api.load", lambda model, engine: NoPromptPath(inspect(model), {}))
    assert cli.main(["cvector", str(path), *prompts, "-o", str(tmp_path / "o.gguf"), "--engine", "gpu"]) == 1
    assert "which this load has not (its staging did not fit); use --engine reference" in capsys.readouterr().err
    assert not (tmp_path / "o.gguf").exists()


def test_a_vector_from_any_measure_of_the_states_is_the_references_from_its_own(tiny_model, rng) -> None:
    """make_control_vector takes the reference itself or a function of the ids (the GPU engine's layer_states):
    the same states give the same vector."""
    with inspect(tiny_model("qwen4exp", seed=5)) as model_file:
        tokenizer, g = model_file.tokenizer(), model_file.geometry
        pairs = list(zip(random_prompts(tokenizer, g.n_vocab, rng, 2), random_prompts(tokenizer, g.n_vocab, rng, 2)))
        reference = Reference(model_file)
        measured = make_control_vector(reference_states(reference), tokenizer, pairs, "pca")
        direct = make_control_vector(reference, tokenizer, pairs, "pca")
    assert sorted(measured) == sorted(direct) == list(range(1, g.n_layer))
    for layer in direct:
        assert np.array_equal(measured[layer], direct[layer]), layer
