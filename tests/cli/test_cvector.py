"""`strata cvector` and the control-vector flags of run, chat, serve and bench (docs/control_vectors.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from strata import cli
from strata.cli.session import control_vectors
from strata.control_vectors import make_control_vector, read_control_vector, steering_table
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
                         str(tmp_path / "neg.txt"), "-o", str(out)]) == 0
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
    base = ["cvector", str(path), "--positive", str(tmp_path / "pos.txt"), "-o", str(tmp_path / "o.gguf")]
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


def test_run_on_the_reference_applies_a_vector_and_the_gpu_commands_refuse_one(tiny_model, tmp_path: Path,
                                                                              capsys) -> None:
    path = tiny_model("qwen3next", seed=5)
    (tmp_path / "pos.txt").write_text("hello\n")
    (tmp_path / "neg.txt").write_text("world\n")
    out = str(tmp_path / "v.gguf")
    assert cli.main(["cvector", str(path), "--positive", str(tmp_path / "pos.txt"), "--negative",
                     str(tmp_path / "neg.txt"), "-o", out, "--method", "pca"]) == 0
    run = ["run", str(path), "-p", "hello", "-n", "2", "--engine", "reference", "--control-vector-scaled", out, "3"]
    assert cli.main([*run, "--control-vector-layer-range", "1", "2"]) == 0
    assert "engine: reference" in capsys.readouterr().err
    assert cli.main([*run, "--control-vector-layer-range", "9", "9"]) == 1
    assert "--control-vector-layer-range (9, 9): start is past the model's last layer" in capsys.readouterr().err
    for command in (["bench", str(path)], ["run", str(path), "-p", "x"]):  # refused before the GPU's load
        assert cli.main([*command, "--control-vector", out]) == 1
        assert "control vectors run on the reference engine only, for now" in capsys.readouterr().err
