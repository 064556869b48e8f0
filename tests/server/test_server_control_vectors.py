"""Control vectors per request (docs/control_vectors.md, "The server"), against a live server on the reference
engine: the vectors given at start steer a request that names none; a request's `control_vectors` picks its own of
them, and its answer is what a session steered so from the start gives; a session steered otherwise is emptied
before it serves a request (no prefix computed under other vectors is resumed), one steered alike resumes it;
GET /control-vectors lists them; ids the server did not load and malformed entries are refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

import strata
from strata.control_vectors import write_control_vector
from strata.format import inspect
from strata.server import Server
from strata.server.background import serving
from strata.synth import synthesize
from support.http_client import RawClient

CONTEXT = 96
PROMPT = "the cat sat on the"
OPTIONS = {"max_tokens": 6, "temperature": 0.0}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny two-layer model and two control vectors of its layer 1, strong enough to move greedy tokens."""
    folder = tmp_path_factory.mktemp("served-vectors")
    model = folder / "tiny.gguf"
    synthesize(model, "qwen3next", "tiny", n_layer=2, seed=21)
    with inspect(model) as file:
        g = file.geometry
    rng = np.random.default_rng(3)
    vectors = []
    for name in ("calm", "loud"):
        path = folder / f"{name}.gguf"
        write_control_vector(path, {1: (rng.standard_normal(g.n_embd) * 4.0).astype(np.float32)}, g.arch)
        vectors.append(path)
    return model, vectors


@pytest.fixture(scope="module")
def live(files):
    model_path, (calm, loud) = files
    started = [(calm, 0.5), (loud, 0.0)]  # loud loaded for requests to pick, steering none by default
    with strata.load(model_path, engine="reference") as model:
        sessions = [model.session(CONTEXT, control_vectors=started) for _ in range(2)]
        server = Server(sessions, "tiny", control_vectors=started)
        with serving(server) as url:
            raw = RawClient(url)
            yield model, raw, server
            raw.close()
        server.close()


def complete(raw: RawClient, **fields) -> tuple[int, dict]:
    answer = raw.send("POST", "/v1/completions", json.dumps({"prompt": PROMPT, **OPTIONS, **fields}).encode())
    return answer.status, json.loads(answer.body)


def alone(model, vectors) -> str:
    with model.session(CONTEXT, control_vectors=vectors) as session:
        return session.complete(PROMPT, **OPTIONS).text


def test_each_request_is_steered_as_it_asks(live, files):
    model, raw, _ = live
    _, (calm, loud) = files
    expected = {"default": alone(model, [(calm, 0.5)]), "loud": alone(model, [(loud, 2.0)]),
                "both": alone(model, [(calm, -1.0), (loud, 1.0)]), "none": alone(model, [])}
    assert len(set(expected.values())) > 1, "the vectors move no token: the test would show nothing"
    asked = {"default": None, "loud": [{"id": 1, "scale": 2.0}],
             "both": [{"id": 0, "scale": -1}, {"id": 1}], "none": []}
    for _ in range(2):  # and again, on sessions steered by the requests before
        for name, vectors in asked.items():
            status, answer = complete(raw, **({} if vectors is None else {"control_vectors": vectors}))
            assert status == 200, answer
            assert answer["choices"][0]["text"] == expected[name], name


def test_a_prefix_is_resumed_only_under_the_vectors_it_was_computed_under(live):
    _, raw, server = live
    steer = {"control_vectors": [{"id": 1, "scale": 2.0}]}
    for session in server.pool.sessions:  # every session now steered by loud x 2 and holding the prompt
        complete(raw, **steer)
    status, answer = complete(raw, **steer)
    assert status == 200 and answer["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, answer
    status, answer = complete(raw, control_vectors=[{"id": 1, "scale": 1.0}])
    assert status == 200 and answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, answer


def test_the_loaded_vectors_are_listed(live):
    _, raw, _ = live
    answer = raw.send("GET", "/control-vectors")
    assert answer.status == 200
    assert json.loads(answer.body) == [{"id": 0, "name": "calm.gguf", "scale": 0.5},
                                       {"id": 1, "name": "loud.gguf", "scale": 0.0}]


@pytest.mark.parametrize(("vectors", "param", "says"), [
    ([{"id": 2}], "control_vectors[0].id", "this server loaded ids 0..1"),
    ([{"id": 0}, {"id": -1}], "control_vectors[1].id", "an integer >= 0"),
    ([{"id": 0, "scale": 1e9}], "control_vectors[0].scale", "a number in"),
    ([{"id": 0, "weight": 1}], "control_vectors[0]", "an 'id' and, optionally, a 'scale'"),
    ({"id": 0}, "control_vectors", "must be a list"),
])
def test_a_bad_entry_is_refused_by_name(live, vectors, param, says):
    _, raw, _ = live
    status, answer = complete(raw, control_vectors=vectors)
    assert status == 400 and answer["error"]["param"] == param and says in answer["error"]["message"], answer


def test_a_server_without_vectors_refuses_any_id(files):
    model_path, _ = files
    with strata.load(model_path, engine="reference") as model:
        server = Server([model.session(CONTEXT)], "tiny")
        with serving(server) as url:
            raw = RawClient(url)
            status, answer = complete(raw, control_vectors=[{"id": 0}])
            assert status == 400 and "this server loaded none" in answer["error"]["message"], answer
            status, answer = complete(raw, control_vectors=[])
            assert status == 200, answer
            raw.close()
        server.close()


def test_sessions_stepped_together_are_steered_each_as_its_request_asks(files):
    """With --batch, the sessions' engines are a batcher's members: steering goes through it."""
    model_path, (calm, loud) = files
    started = [(calm, 0.5), (loud, 0.0)]
    with strata.load(model_path, engine="reference") as model:
        expected = alone(model, [(loud, 2.0)])
        server = Server([model.session(CONTEXT, control_vectors=started) for _ in range(2)], "tiny", batch=2,
                        control_vectors=started)
        with serving(server) as url:
            raw = RawClient(url)
            status, answer = complete(raw, control_vectors=[{"id": 1, "scale": 2.0}], n=2)
            assert status == 200 and [c["text"] for c in answer["choices"]] == [expected] * 2, answer
            raw.close()
        server.close()
