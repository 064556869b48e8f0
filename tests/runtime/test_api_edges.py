"""The API's edges on both engines: keyword-only session options, GPU-only options refused by name on the
reference, score on both, seed=-1 random everywhere, every bad argument an InvalidArgument that names it, a
closed model refusing sessions. On the CPU: the reference engine, and the GPU model's checks, which run before
anything reaches the GPU."""

import inspect as signature_of

import numpy as np
import pytest

import strata
from strata.api import GPU_SESSION_OPTIONS, ReferenceModel
from strata.format import inspect
from strata.reference import Reference
from strata.runtime.model import Model, describe
from strata.synth import synthesize


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("api") / "tiny.gguf"
    synthesize(path, "qwen3next", "tiny", n_layer=4, seed=3)
    return path


@pytest.fixture
def reference(tiny):
    with strata.load(tiny, engine="reference") as model:
        yield model


@pytest.fixture
def gpu_model(tiny):
    """A GPU Model as far as its session's checks go: its file and plan, no weights on a device."""
    with inspect(tiny) as file:
        yield Model(file, describe(file), weights=object(), pool=None)


def test_both_engines_take_every_option_after_context_by_keyword_only():
    for session in (Model.session, ReferenceModel.session):
        parameters = list(signature_of.signature(session).parameters.values())[1:]
        assert parameters[0].name == "context" and parameters[0].kind is parameters[0].POSITIONAL_OR_KEYWORD
        assert all(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in parameters[1:]), session
    gpu = set(signature_of.signature(Model.session).parameters)
    assert set(GPU_SESSION_OPTIONS) < gpu and {"kv", "snapshots", "defer_experts", "draft", "draft_tokens"} < gpu


def test_the_reference_session_takes_a_kv_by_name_and_refuses_gpu_options_by_name(reference):
    with pytest.raises(TypeError):
        reference.session(64, strata.KV.INT8)
    session = reference.session(64, kv=strata.KV.INT8, snapshots=1)
    assert session.complete("hi", 2).usage.completion_tokens >= 1
    assert session.engine.reference._kv is strata.KV.INT8
    for name in GPU_SESSION_OPTIONS:
        with pytest.raises(strata.InvalidArgument, match=f"^{name}: the reference engine's session has no such"):
            reference.session(64, **{name: 1})
    with pytest.raises(strata.InvalidArgument, match="unknown session option 'colour'"):
        reference.session(colour="red")


def test_a_reference_session_with_drafts_answers_as_one_without(reference):
    prompt = "one two three one two three one two"
    plain = reference.session(64).complete(prompt, 12)
    session = reference.session(64, draft="lookup", draft_tokens=3)
    assert session.engine.verify_rows == 4 and session.draft_length.max_drafts == 3
    assert session.complete(prompt, 12).tokens == plain.tokens
    assert reference.session(64, draft="auto").engine.verify_rows == 5  # the default draft_tokens, 4
    assert reference.session(64).drafter is None


def test_score_on_the_reference_gives_every_positions_logits(reference, rng):
    n_vocab = reference.file.geometry.n_vocab
    ids = [int(t) for t in rng.integers(0, n_vocab, 7)]
    engine = reference.session(64).engine
    logits = engine.score(ids, ids)
    assert logits.shape == (7, n_vocab) and logits.dtype == np.float32 and np.isfinite(logits).all()
    stepped = Reference(reference.file)
    want = np.stack([stepped.forward([t])[-1] for t in ids])
    np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5)  # one pass against seven: float32 rounding
    assert engine.position == 7


def test_seed_minus_one_is_a_random_seed(reference):
    session = reference.session(64)
    draws = {session.complete("hi", 4, temperature=5.0, seed=-1).tokens for _ in range(4)}
    assert len(draws) > 1  # four random seeds at temperature 5 over 512 tokens: the same four tokens is ~never
    assert session.complete("hi", 4, temperature=5.0, seed=7).tokens == session.complete(
        "hi", 4, temperature=5.0, seed=7).tokens
    with pytest.raises(strata.InvalidArgument, match="seed must be >= 0 .or -1 or None"):
        session.complete("hi", 4, seed=-2)


@pytest.mark.parametrize(("call", "fragment"), [
    (dict(temperature="hot"), "temperature must be a number"),
    (dict(temperature=True), "temperature must be a number"),
    (dict(top_p=None), "top_p must be a number"),
    (dict(top_k=1.5), "top_k must be an integer"),
    (dict(top_k="3"), "top_k must be an integer"),
    (dict(max_tokens="5"), "max_tokens must be an integer"),
    (dict(max_tokens=2.0), "max_tokens must be an integer"),
    (dict(logprobs="2"), "logprobs must be an integer"),
    (dict(seed="x"), "seed must be an integer"),
    (dict(seed=1.5), "seed must be an integer"),
    (dict(stop=3), "stop must be a string or a list of strings"),
    (dict(stop=[None]), "stop must be a string or a list of strings"),
    (dict(prompt=None), "prompt must be text or a list of token ids"),
    (dict(prompt=b"hi"), "prompt must be text or a list of token ids"),
    (dict(prompt=[1.5]), "prompt's token id must be an integer"),
    (dict(prompt=["a"]), "prompt's token id must be an integer"),
    (dict(prompt=[10**9]), "prompt token id 1000000000 is outside the vocabulary 0..511"),
    (dict(prompt=[-1]), "prompt token id -1 is outside the vocabulary"),
    (dict(special="yes"), "special must be True or False"),
    (dict(colour="red"), "unknown option 'colour'"),
])
@pytest.mark.parametrize("method", ["generate", "stream", "complete"])
def test_every_bad_call_argument_is_an_invalid_argument_that_names_it(reference, method, call, fragment):
    session = reference.session(64)
    call = {"prompt": "hi", **call}
    with pytest.raises(strata.InvalidArgument, match=fragment):
        result = getattr(session, method)(**call)
        list(result) if method != "complete" else None
    assert session.complete("hi", 1).usage.completion_tokens == 1  # the session is still usable


@pytest.mark.parametrize(("options", "fragment"), [
    (dict(context="big"), "context must be an integer"),
    (dict(context=1.5), "context must be an integer"),
    (dict(context=10**9), "context 1000000000 is outside"),
    (dict(snapshots="2"), "snapshots must be an integer"),
    (dict(snapshots=-1), "snapshots must be >= 0"),
    (dict(defer_experts="1"), "defer_experts must be in"),
    (dict(kv=5), "unknown KV format 5"),
    (dict(draft="lookup", draft_tokens=0), r"draft_tokens must be in 1..7, got 0"),
    (dict(draft="lookup", draft_tokens=9), r"draft_tokens must be in 1..7, got 9"),
    (dict(draft="mtp"), r"draft 'mtp': this \w+ file has no MTP block"),
    (dict(draft="eagle"), "unknown draft 'eagle'"),
    (dict(control_vectors=["v.gguf"]), r"control_vectors takes \(path, scale\) pairs, got 'v.gguf'"),
    (dict(control_layers=(3, 1)), r"control_layers \(3, 1\): need 0 <= start <= end"),
])
def test_bad_reference_session_options_are_named(reference, options, fragment):
    with pytest.raises(strata.InvalidArgument, match=fragment):
        reference.session(**options)


@pytest.mark.parametrize(("options", "fragment"), [
    (dict(context="big"), "context must be an integer"),
    (dict(timeout="5"), "timeout must be a number"),
    (dict(timeout=0), "timeout must be > 0 seconds"),
    (dict(prompt_cpu="yes"), "prompt_cpu must be True or False"),
    (dict(kv_streaming=1), "kv_streaming must be True or False"),
    (dict(prompt_chunk=-1), "prompt_chunk must be >= 0"),
    (dict(prompt_chunk="64"), "prompt_chunk must be an integer"),
    (dict(snapshots="2"), "snapshots must be an integer"),
    (dict(kv="int5"), "unknown KV format 'int5'"),
    (dict(mode="fast"), "unknown session mode 'fast'"),
    (dict(defer_experts=2.0), "defer_experts must be in"),
    (dict(draft="lookup", draft_tokens=0), r"draft_tokens must be in 1..7, got 0"),
    (dict(draft="lookup", draft_tokens=9), r"draft_tokens must be in 1..7, got 9"),
    (dict(draft="mtp"), r"draft 'mtp': MTP drafts run on the reference engine only, for now"),
    (dict(draft="eagle"), "unknown draft 'eagle'"),
    (dict(draft="auto", prompt_chunk=0), "draft 'auto' needs the prompt path, which verifies the drafts: "
                                         "prompt_chunk=0 turns it off"),
    (dict(control_vectors=["v.gguf"]), r"control_vectors takes \(path, scale\) pairs, got 'v.gguf'"),
    (dict(control_layers=(3, 1)), r"control_layers \(3, 1\): need 0 <= start <= end"),
])
def test_bad_gpu_session_options_are_named_before_the_gpu_is_touched(gpu_model, options, fragment):
    with pytest.raises(strata.InvalidArgument, match=fragment):
        gpu_model.session(**options)


def test_a_closed_model_opens_no_sessions(tiny, gpu_model):
    model = strata.load(tiny, engine="reference")
    model.close()
    with pytest.raises(strata.StrataError, match="this model is closed"):
        model.session()
    gpu_model.weights = None  # what Model.close leaves
    with pytest.raises(strata.StrataError, match="this model is closed"):
        gpu_model.session()


def test_load_names_a_bad_path_or_engine(tiny):
    with pytest.raises(strata.InvalidArgument, match="path must be a file path"):
        strata.load(3, engine="reference")
    with pytest.raises(strata.InvalidArgument, match="unknown engine 'cpu'"):
        strata.load(tiny, engine="cpu")
