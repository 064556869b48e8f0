"""support.models: the tiny model files that tests share are written once per session, one per distinct model."""

from strata.format import inspect


def test_a_tiny_model_is_written_once_and_shared(tiny_model):
    path = tiny_model("qwen3next", seed=4)
    assert tiny_model("qwen3next", seed=4) == path
    with inspect(path) as file:
        assert file.geometry.arch == "qwen3next"
    assert tiny_model("qwen3next", seed=5) != path
    assert tiny_model("qwen3next", seed=4, types="Q8_0") != path
