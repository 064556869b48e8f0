"""Control vectors on the GPU engine's side, without a GPU (docs/control_vectors.md): the table staged as the
native session takes it (strata.runtime.steering), GpuEngine.set_control_vectors and layer_states over a scripted
native session that records what it is handed, Session.set_control_vectors over any engine (the reference's run
end to end, bit for bit against the reference switched alike), Model.session's checks before the GPU, and the
command line: the control-vector flags reach Model.session on the gpu engine of run, chat, serve and bench."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import strata
from strata import cli
from strata.control_vectors import steering_table, write_control_vector
from strata.errors import InvalidArgument, StrataError
from strata.format import inspect
from strata.generation import Session
from strata.reference import Reference
from strata.runtime.engine import GpuEngine
from strata.runtime.model import Model, describe
from strata.runtime.steering import ControlVectors

GEOMETRY = SimpleNamespace(n_layer=4, n_embd=8, arch="qwen3next")


class ScriptedNative:
    """A native decode session as GpuEngine drives it for control vectors: it records each table it is handed
    and answers layer_states with a pattern of the ids it was fed."""

    def __init__(self, prompt_chunk: int = 16):
        self.prompt_chunk, self.position = prompt_chunk, 0
        self.handed: list[tuple[np.ndarray, np.ndarray]] = []
        self.resets = 0
        self.fed: list[tuple[list[int], object]] = []

    def set_control_vectors(self, table, layers) -> None:
        table, layers = np.asarray(table), np.asarray(layers)
        assert table.dtype == np.float32 and layers.dtype == np.uint8  # what the binding converts to without a copy
        assert table.shape == (GEOMETRY.n_layer, GEOMETRY.n_embd) and layers.shape == (GEOMETRY.n_layer,)
        self.handed.append((table.copy(), layers.copy()))

    @property
    def control_vector_layers(self) -> list[int]:
        return [int(layer) for layer in np.flatnonzero(self.handed[-1][1])] if self.handed else []

    def reset(self) -> None:
        self.resets += 1
        self.position = 0

    def layer_states(self, ids, ple_rows) -> np.ndarray:
        self.fed.append((list(ids), ple_rows))
        self.position = len(ids)
        return np.full((GEOMETRY.n_layer, GEOMETRY.n_embd), float(sum(ids)), np.float32)


def vector_file(tmp_path: Path, name: str, directions: dict[int, list[float]] | dict[int, np.ndarray]) -> Path:
    path = tmp_path / name
    write_control_vector(path, {n: np.asarray(v, np.float32) for n, v in directions.items()}, GEOMETRY.arch)
    return path


def test_a_table_is_staged_as_one_row_and_one_flag_per_layer():
    one, three = np.arange(8, dtype=np.float32), -np.ones(8, np.float32)
    rows, flags = ControlVectors(GEOMETRY).staged({3: three, 1: one})
    assert rows.dtype == np.float32 and rows.shape == (4, 8) and flags.dtype == np.uint8
    assert flags.tolist() == [0, 1, 0, 1]
    assert np.array_equal(rows[1], one) and np.array_equal(rows[3], three)
    assert not rows[0].any() and not rows[2].any()
    rows, flags = ControlVectors(GEOMETRY).staged({})
    assert not flags.any() and not rows.any()  # no vector at all: the native session adds nothing


@pytest.mark.parametrize(("table", "fragment"), [
    ({4: np.zeros(8)}, r"layer 4: need a layer in 0..3 and shape \(8,\)"),
    ({-1: np.zeros(8)}, r"layer -1: need a layer in 0..3"),
    ({True: np.zeros(8)}, r"layer True: need a layer in 0..3"),
    ({1: np.zeros(7)}, r"got shape \(7,\)"),
    ({2: np.array([0, 0, 0, np.inf, 0, 0, 0, 0])}, "layer 2: its values must be finite"),
])
def test_a_bad_table_is_refused_naming_the_layer(table, fragment):
    with pytest.raises(InvalidArgument, match=fragment):
        ControlVectors(GEOMETRY).staged(table)


def test_the_table_reads_the_files_as_the_reference_does(tmp_path):
    a = vector_file(tmp_path, "a.gguf", {1: np.ones(8), 2: np.arange(8), 3: np.full(8, 0.5)})
    b = vector_file(tmp_path, "b.gguf", {2: np.ones(8)})
    got = ControlVectors(GEOMETRY).table([(a, 2.0), (b, -1.0)], (2, 3))
    want = steering_table([(a, 2.0), (b, -1.0)], GEOMETRY, (2, 3))
    assert sorted(got) == sorted(want) == [2, 3]
    for layer in want:
        assert np.array_equal(got[layer], want[layer])
    assert np.array_equal(got[2], (np.arange(8) * 2 - 1).astype(np.float32))


def test_the_engine_stages_a_sessions_vectors_and_changes_them(tmp_path):
    native = ScriptedNative()
    engine = GpuEngine(native, control_vectors=ControlVectors(GEOMETRY))
    a = vector_file(tmp_path, "a.gguf", {1: np.arange(8), 3: np.ones(8)})
    engine.set_control_vectors([(a, 0.5)])
    table, flags = native.handed[-1]
    assert flags.tolist() == [0, 1, 0, 1] and engine.steered_layers == [1, 3]
    assert np.array_equal(table[1], np.arange(8, dtype=np.float32) * 0.5) and not table[0].any()
    engine.set_control_vectors([(a, 0.5)], (2, 3))  # the range keeps layer 3 only
    assert native.handed[-1][1].tolist() == [0, 0, 0, 1] and engine.steered_layers == [3]
    engine.set_control_vectors()  # none
    assert not native.handed[-1][1].any() and engine.steered_layers == []
    count = len(native.handed)
    with pytest.raises(InvalidArgument, match=r"control_layers \(3, 1\)"):
        engine.set_control_vectors([(a, 1.0)], (3, 1))
    with pytest.raises(InvalidArgument, match="the scale must be a finite number"):
        engine.set_control_vectors([(a, float("nan"))])
    assert len(native.handed) == count  # refused before the native session was touched


def test_an_engine_made_without_the_models_vectors_refuses_them():
    engine = GpuEngine(ScriptedNative())
    with pytest.raises(InvalidArgument, match="made without the model's control vectors"):
        engine.set_control_vectors([("v.gguf", 1.0)])
    with pytest.raises(InvalidArgument, match="made without the model's control vectors"):
        engine.set_steering({})


def test_layer_states_feed_from_an_empty_sequence_through_the_prompt_path():
    native = ScriptedNative()
    engine = GpuEngine(native, control_vectors=ControlVectors(GEOMETRY))
    states = engine.layer_states([3, 4, 5])
    assert native.resets == 1 and native.fed == [([3, 4, 5], None)] and engine.position == 3
    assert states.shape == (4, 8) and np.all(states == 12.0)
    with pytest.raises(InvalidArgument, match="encodes to no tokens"):
        engine.layer_states([])
    with pytest.raises(InvalidArgument, match="needs the prompt path"):
        GpuEngine(ScriptedNative(prompt_chunk=0)).layer_states([1])


def test_a_session_hands_its_vectors_to_the_engine_between_calls(tmp_path):
    native = ScriptedNative()
    session = Session(GpuEngine(native, control_vectors=ControlVectors(GEOMETRY)), codec=None)
    a = vector_file(tmp_path, "a.gguf", {2: np.ones(8)})
    session.set_control_vectors([(a, 3.0)])
    assert native.handed[-1][1].tolist() == [0, 0, 1, 0] and np.all(native.handed[-1][0][2] == 3.0)
    plain = Session(SimpleNamespace(context=64, position=0, feed=None, reset=None), codec=None)
    with pytest.raises(InvalidArgument, match="this session's engine takes no control vectors"):
        plain.set_control_vectors([(a, 1.0)])


def test_vectors_changed_between_turns_on_the_reference_are_the_references_switched_alike(tiny_model, tmp_path):
    path = tiny_model("qwen3next", seed=5)
    rng = np.random.default_rng(3)
    with inspect(path) as file:
        g = file.geometry
        a = vector_file(tmp_path, "a.gguf", {n: rng.standard_normal(g.n_embd) for n in range(1, g.n_layer)})
        b = vector_file(tmp_path, "b.gguf", {2: rng.standard_normal(g.n_embd)})
        first, second, third = ([int(t) for t in rng.integers(0, g.n_vocab, 5)] for _ in range(3))
        model = strata.load(path, engine="reference")
        session = model.session(64, control_vectors=[(a, 0.5)], control_layers=(1, 2))
        engine = session.engine
        got = [engine.score(first, first)]
        session.set_control_vectors([(b, 2.0)])
        got.append(engine.score(second, first + second))
        session.set_control_vectors()
        got.append(engine.score(third, first + second + third))
        reference = Reference(file, control_vectors=steering_table([(a, 0.5)], g, (1, 2)))
        want = [reference.forward(first)]
        reference.set_control_vectors(steering_table([(b, 2.0)], g))
        want.append(reference.forward(second))
        reference.set_control_vectors({})
        want.append(reference.forward(third))
        for i, (x, y) in enumerate(zip(got, want)):
            assert np.array_equal(x, y), i
        unsteered = Reference(file).forward(first)
        assert not np.array_equal(got[0], unsteered)  # the first turn's vectors moved its logits
        model.close()


@pytest.fixture
def gpu_model(tiny_model):
    """A GPU Model as far as its session's checks go: its file and plan, no weights on a device."""
    with inspect(tiny_model("qwen3next", seed=5)) as file:
        yield Model(file, describe(file), weights=object(), pool=None)


def test_model_session_reads_the_vectors_before_the_gpu_is_touched(gpu_model, tmp_path):
    n_embd = gpu_model.info.geometry.n_embd
    wide = tmp_path / "wide.gguf"
    write_control_vector(wide, {1: np.ones(n_embd + 1, np.float32)}, "qwen3next")
    with pytest.raises(InvalidArgument, match=rf"wide.gguf: direction.1 has {n_embd + 1} values, the model's "
                                              rf"n_embd is {n_embd}"):
        gpu_model.session(control_vectors=[(wide, 1.0)])
    with pytest.raises(InvalidArgument, match=r"control_layers \(9, 9\): start is past the model's last layer"):
        gpu_model.session(control_vectors=[(wide, 1.0)], control_layers=(9, 9))


class PastTheChecks(StrataError):
    """Raised where the GPU would be asked for: the command got past every check before it."""


@pytest.mark.parametrize("command", [["run", "-p", "hi"], ["chat"], ["serve"], ["bench"]])
def test_the_gpu_commands_take_the_control_vector_flags(command, tiny_model, tmp_path, monkeypatch, capsys):
    path = tiny_model("qwen3next", seed=5)
    vector = vector_file(tmp_path, "v.gguf", {1: np.ones(256)})

    def no_gpu(hint: str) -> None:
        raise PastTheChecks("past the checks")

    monkeypatch.setattr("strata.cli.session.require_gpu", no_gpu)
    argv = [command[0], str(path), *command[1:], "--control-vector-scaled", str(vector), "2",
            "--control-vector-layer-range", "1", "2"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "past the checks" in err and "reference engine only" not in err, err


def test_bench_steers_every_session_it_measures(tiny_model, tmp_path, monkeypatch):
    path = tiny_model("qwen3next", seed=5)
    vector = vector_file(tmp_path, "v.gguf", {1: np.ones(256)})
    seen = {}

    class Loaded:
        def __enter__(self):
            return "model"

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr("strata.cli.session.require_gpu", lambda hint: None)
    monkeypatch.setattr(strata, "load", lambda *args, **options: Loaded(), raising=False)
    monkeypatch.setattr("strata.cli.bench.run", lambda model, **options: seen.update(options))
    assert cli.main(["bench", str(path), "--control-vector", str(vector), "--control-vector-scaled", str(vector),
                     "-1", "--control-vector-layer-range", "1", "3"]) == 0
    assert seen["control_vectors"] == [(str(vector), 1.0), (str(vector), -1.0)]
    assert seen["control_layers"] == (1, 3)


def test_served_sessions_all_take_the_vectors_given_at_start(tiny_model, tmp_path):
    """`strata serve --control-vector`: every session the server makes is steered (the reference's here; the gpu
    engine's sessions are made by the same call)."""
    from strata.cli import serve

    path = tiny_model("qwen3next", seed=5)
    vector = vector_file(tmp_path, "v.gguf", {1: np.ones(256), 3: np.ones(256)})
    args = cli.parse_args(["serve", str(path), "--engine", "reference", "--context", "64", "--control-vector",
                           str(vector), "--control-vector-layer-range", "2", "3"])
    model = strata.load(path, engine="reference")
    sessions: list = []
    try:
        serve.made_sessions(model, args, 3, sessions, reduce=False)
        assert len(sessions) == 3
        for session in sessions:
            assert sorted(session.engine.reference.control_vectors) == [3]
    finally:
        for session in sessions:
            session.close()
        model.close()
