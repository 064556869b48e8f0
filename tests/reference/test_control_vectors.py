"""Control vectors (docs/control_vectors.md): llama.cpp's files read as its loader reads them (direction.N steers
layer N, the scales of several files summed, a layer range) and refused by name where they do not fit the model;
the numpy reference adds them to the layers' outputs, every stream alike, and a zero vector changes nothing."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from strata.api import load
from strata.control_vectors import read_control_vector, steering_table, write_control_vector
from strata.errors import FormatError, InvalidArgument
from strata.format import inspect
from strata.reference import Reference

ARCHS = ["qwen4exp", "qwen3next"]  # hyper-connection streams, and one stream


def write_llamacpp_layout(path: Path, directions: dict[int, np.ndarray], hint: str = "qwen3next") -> Path:
    """A file as llama.cpp's cvector-generator's export_gguf lays it out, written by gguf-py directly."""
    writer = gguf.GGUFWriter(str(path), "controlvector")
    writer.add_string("controlvector.model_hint", hint)
    writer.add_int32("controlvector.layer_count", len(directions))
    for layer, vector in directions.items():
        writer.add_tensor(f"direction.{layer}", vector)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def random_directions(rng: np.random.Generator, layers, n_embd: int) -> dict[int, np.ndarray]:
    return {layer: rng.standard_normal(n_embd).astype(np.float32) for layer in layers}


@pytest.fixture(params=ARCHS)
def model(request: pytest.FixtureRequest, tiny_model):
    with inspect(tiny_model(request.param, seed=3)) as model_file:
        yield model_file


def test_a_file_in_llamacpps_layout_loads_with_direction_n_on_layer_n(model, tmp_path, rng) -> None:
    g = model.geometry
    directions = random_directions(rng, range(1, g.n_layer), g.n_embd)
    path = write_llamacpp_layout(tmp_path / "v.gguf", directions, hint=g.arch)
    read = read_control_vector(path)
    assert (read.model_hint, read.layer_count, sorted(read.directions)) == (g.arch, g.n_layer - 1,
                                                                             list(range(1, g.n_layer)))
    table = steering_table([(path, 1.0)], g)
    assert sorted(table) == list(range(1, g.n_layer))
    for layer, vector in directions.items():
        assert np.array_equal(table[layer], vector)


def test_several_files_scales_sum_in_float32(model, tmp_path, rng) -> None:
    g = model.geometry
    first = random_directions(rng, [1, 2], g.n_embd)
    second = random_directions(rng, [2, 3], g.n_embd)
    a, b = float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))
    paths = (write_llamacpp_layout(tmp_path / "a.gguf", first, g.arch),
             write_llamacpp_layout(tmp_path / "b.gguf", second, g.arch))
    table = steering_table([(paths[0], a), (paths[1], b)], g)
    zero = np.zeros(g.n_embd, np.float32)
    assert sorted(table) == [1, 2, 3]
    assert np.array_equal(table[1], zero + first[1] * np.float32(a))
    assert np.array_equal(table[2], zero + first[2] * np.float32(a) + second[2] * np.float32(b))
    assert np.array_equal(table[3], zero + second[3] * np.float32(b))


def test_a_scale_that_overflows_float32_is_refused_at_load(model, tmp_path, rng) -> None:
    g = model.geometry
    directions = random_directions(rng, [1, 2], g.n_embd)
    path = write_llamacpp_layout(tmp_path / "v.gguf", directions, g.arch)
    with pytest.raises(InvalidArgument, match=r"v\.gguf: direction\.1 times 1e\+39 is not finite in float32"):
        steering_table([(path, 1e39)], g)  # finite as a double, infinite as the float32 the vectors are
    big = float(np.finfo(np.float32).max) / max(float(np.abs(d).max()) for d in directions.values()) * 0.75
    steering_table([(path, big)], g)  # each alone fits; summed, they do not
    with pytest.raises(InvalidArgument, match=r"direction\.[12] times .* plus the vectors before it is not finite"):
        steering_table([(path, big), (path, big)], g)


def test_the_layer_range_keeps_start_to_end_inclusive(model, tmp_path, rng) -> None:
    g = model.geometry
    path = write_llamacpp_layout(tmp_path / "v.gguf", random_directions(rng, range(1, g.n_layer), g.n_embd),
                                 g.arch)
    assert sorted(steering_table([(path, 1.0)], g, (2, 2))) == [2]
    assert sorted(steering_table([(path, 1.0)], g, (0, 2))) == [1, 2]  # layer 0 never has a vector
    assert sorted(steering_table([(path, 1.0)], g, (2, 99))) == list(range(2, g.n_layer))
    for bad in [(2, 1), (-1, 2), (g.n_layer, g.n_layer + 1), (1,), "12"]:
        with pytest.raises(InvalidArgument, match="control_layers"):
            steering_table([(path, 1.0)], g, bad)


def test_a_wrong_width_is_refused_naming_the_file_tensor_and_limit(model, tmp_path, rng) -> None:
    g = model.geometry
    path = write_llamacpp_layout(tmp_path / "narrow.gguf", random_directions(rng, [1, 2], g.n_embd - 8), g.arch)
    with pytest.raises(InvalidArgument, match=rf"narrow\.gguf: direction\.1 has {g.n_embd - 8} values, the "
                                              rf"model's n_embd is {g.n_embd}"):
        steering_table([(path, 1.0)], g)


def test_a_layer_the_model_lacks_is_refused_naming_it(model, tmp_path, rng) -> None:
    g = model.geometry
    path = write_llamacpp_layout(tmp_path / "deep.gguf", random_directions(rng, [1, g.n_layer], g.n_embd), g.arch)
    with pytest.raises(InvalidArgument, match=rf"deep\.gguf: direction\.{g.n_layer} steers layer {g.n_layer}, "
                                              rf"the model's last layer is {g.n_layer - 1}"):
        steering_table([(path, 1.0)], g)


@pytest.mark.parametrize("case, message", [
    ("no directions", r"empty\.gguf: no direction tensors"),
    ("layer 0", r"zero\.gguf: tensor 'direction\.0' is not a direction\.N with N >= 1"),
    ("other name", r"other\.gguf: tensor 'steer\.1' is not a direction\.N"),
    ("float16", r"half\.gguf: tensor direction\.1 must be 1-D float32, got F16"),
    ("2-D", r"square\.gguf: tensor direction\.1 must be 1-D float32"),
    ("uneven", r"uneven\.gguf: tensor direction\.2 has 8 values, the file's other directions 16"),
])
def test_malformed_files_are_refused_by_name(tmp_path, rng, case: str, message: str) -> None:
    vector = rng.standard_normal(16).astype(np.float32)
    contents = {"no directions": ("empty", {}), "layer 0": ("zero", {0: vector}),
                "float16": ("half", {1: vector.astype(np.float16)}), "2-D": ("square", {1: vector.reshape(4, 4)}),
                "uneven": ("uneven", {1: vector, 2: vector[:8]})}
    if case == "other name":
        writer = gguf.GGUFWriter(str(tmp_path / "other.gguf"), "controlvector")
        writer.add_tensor("steer.1", vector)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        path = tmp_path / "other.gguf"
    else:
        name, directions = contents[case]
        path = write_llamacpp_layout(tmp_path / f"{name}.gguf", directions)
    with pytest.raises(FormatError, match=message):
        read_control_vector(path)


def test_a_model_file_is_not_a_control_vector(tiny_model) -> None:
    path = tiny_model("qwen3next", seed=3)
    with pytest.raises(FormatError, match=r"model\.gguf: general\.architecture is 'qwen3next', not 'controlvector'"):
        read_control_vector(path)


def test_another_models_hint_is_only_warned_about(model, tmp_path, rng) -> None:
    g = model.geometry
    path = write_llamacpp_layout(tmp_path / "v.gguf", random_directions(rng, [1], g.n_embd), hint="llama")
    with pytest.warns(UserWarning, match=f"made for 'llama', this model is '{g.arch}'"):
        assert sorted(steering_table([(path, 1.0)], g)) == [1]


def test_strata_writes_what_llamacpps_reader_sees(tmp_path, rng) -> None:
    directions = random_directions(rng, [1, 2, 3], 32)
    write_control_vector(tmp_path / "v.gguf", directions, "qwen35moe")
    reader = gguf.GGUFReader(tmp_path / "v.gguf")
    fields = {name: reader.fields[name].contents() for name in
              ("general.architecture", "controlvector.model_hint", "controlvector.layer_count")}
    assert fields == {"general.architecture": "controlvector", "controlvector.model_hint": "qwen35moe",
                      "controlvector.layer_count": 3}
    assert reader.fields["controlvector.layer_count"].types == [gguf.GGUFValueType.INT32]
    for tensor in reader.tensors:
        assert tensor.tensor_type == gguf.GGMLQuantizationType.F32 and len(tensor.shape) == 1
        assert np.array_equal(tensor.data, directions[int(tensor.name.split(".")[1])])


def forward(model_file, ids: np.ndarray, steering=None):
    return Reference(model_file, control_vectors=steering).forward(ids, dump=True)


def test_a_zero_vector_leaves_the_logits_bit_identical(model, rng) -> None:
    g = model.geometry
    ids = rng.integers(0, g.n_vocab, 5)
    plain, _ = forward(model, ids)
    zero, _ = forward(model, ids, {layer: np.zeros(g.n_embd, np.float32) for layer in range(1, g.n_layer)})
    assert np.array_equal(plain.view(np.uint32), zero.view(np.uint32))


def test_a_vector_moves_its_layers_output_on_every_stream_and_nothing_before(model, rng) -> None:
    g = model.geometry
    ids = rng.integers(0, g.n_vocab, 4)
    layer = int(rng.integers(1, g.n_layer - 1))
    vector = rng.standard_normal(g.n_embd).astype(np.float32)
    plain_logits, plain = forward(model, ids)
    logits, steered = forward(model, ids, {layer: vector})
    for before in range(layer):
        assert np.array_equal(steered[before]["streams_after_ffn"], plain[before]["streams_after_ffn"])
    # the steered layer's own blocks saw the same input, and its output moved by the vector on every stream
    assert np.array_equal(steered[layer]["streams_after_mixer"], plain[layer]["streams_after_mixer"])
    before = plain[layer]["streams_after_ffn"]
    moved = steered[layer]["streams_after_ffn"] - before
    rounding = 2 * np.finfo(np.float32).eps * (np.abs(before) + np.abs(vector)).max()  # one float32 add and sub
    assert np.abs(moved - vector).max() <= rounding
    for after in range(layer + 1, g.n_layer):
        assert not np.array_equal(steered[after]["mixer_out"], plain[after]["mixer_out"])
    assert np.isfinite(logits).all() and not np.array_equal(logits, plain_logits)


def test_the_reference_session_applies_the_files_and_checks_them(tiny_model, tmp_path, rng) -> None:
    path = tiny_model("qwen3next", seed=3)
    with load(path, engine="reference") as model:
        g = model.file.geometry
        vector = write_llamacpp_layout(tmp_path / "v.gguf", random_directions(rng, [1, 2], g.n_embd))
        zero = write_llamacpp_layout(tmp_path / "z.gguf", {1: np.zeros(g.n_embd, np.float32)})
        ids = rng.integers(0, g.n_vocab, 4).tolist()

        def scores(**options):
            with model.session(64, **options) as session:
                return session.engine.score(ids, [])

        plain = scores()
        assert np.array_equal(scores(control_vectors=[(zero, 3.0)]), plain)
        assert not np.array_equal(scores(control_vectors=[(vector, 1.0)]), plain)
        assert np.array_equal(scores(control_vectors=[(vector, 1.0)], control_layers=(3, 3)), plain)
        with pytest.raises(InvalidArgument, match="the scale must be a finite number"):
            scores(control_vectors=[(vector, float("nan"))])
        with pytest.raises(InvalidArgument, match=r"control_vectors takes \(path, scale\) pairs"):
            scores(control_vectors=[str(vector)])
