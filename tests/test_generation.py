"""Generation over an engine: streaming, stops, carry-over, one generate at a time, Ctrl-C at a token boundary."""

import os
import signal

import numpy as np
import pytest

import strata
from strata.format import inspect
from strata.generation import Session
from strata.reference import Reference
from strata.reference.engine import ReferenceEngine
from strata.sampling import SamplingParams, sample
from strata.synth import synthesize


class ScriptedEngine:
    """Returns a fixed script of tokens; records what it was fed."""

    def __init__(self, script, context=64):
        self.script, self.context, self.position, self.fed = list(script), context, 0, []

    def feed(self, ids, params, u, seen):
        self.fed.append(list(ids))
        self.position += len(ids)
        return self.script.pop(0)

    def reset(self):
        self.position = 0
        self.fed.clear()


class CharCodec:
    """Token i is chr(i); 0 is EOS."""

    eos_ids = [0]

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def run(session, prompt, **kw):
    pieces = list(session.generate(prompt, **kw))
    return "".join(p.text for p in pieces), [p.token for p in pieces]


def test_text_streams_until_eos_and_the_sequence_carries_over():
    engine = ScriptedEngine([ord(c) for c in "hi"] + [0] + [ord("!"), 0])
    session = Session(engine, CharCodec())
    assert run(session, "ab") == ("hi", [ord("h"), ord("i")])
    assert session.stats.finish_reason == "eos" and session.stats.prompt_tokens == 2
    assert run(session, "c")[0] == "!"
    # The EOS that ended the first answer is fed before the second prompt: the engine saw the whole text.
    assert engine.fed == [[97, 98], [104], [105], [0, 99], [33]]


def test_a_stop_string_is_cut_and_never_shown_even_across_tokens():
    engine = ScriptedEngine([ord(c) for c in "one<end>x"])
    session = Session(engine, CharCodec())
    pieces = list(session.generate("q", stop=["<end>"]))
    assert "".join(p.text for p in pieces) == "one"
    # "<en" was held back while it could still become the stop string.
    assert [p.text for p in pieces][3:] == ["", "", "", "", ""]
    assert session.stats.finish_reason == "stop"


def test_max_tokens_and_context_end_generation():
    session = Session(ScriptedEngine([ord("a")] * 10), CharCodec())
    assert run(session, "q", max_tokens=3)[0] == "aaa" and session.stats.finish_reason == "length"
    small = Session(ScriptedEngine([ord("a")] * 10, context=5), CharCodec())
    assert run(small, "qq")[0] == "aaa" and small.stats.finish_reason == "context"
    with pytest.raises(strata.InvalidArgument, match="reset"):
        list(small.generate("more"))


def test_one_generate_at_a_time():
    session = Session(ScriptedEngine([ord("a")] * 10), CharCodec())
    first = session.generate("q")
    next(first)
    with pytest.raises(strata.StrataError, match="already generating"):
        next(session.generate("q"))
    with pytest.raises(strata.StrataError, match="already generating"):
        session.reset()
    first.close()
    session.reset()
    assert run(session, "q", max_tokens=1)[0] == "a"


def test_ctrl_c_stops_at_a_token_boundary_and_the_session_stays_usable():
    class InterruptingEngine(ScriptedEngine):
        def feed(self, ids, params, u, seen):
            token = super().feed(ids, params, u, seen)
            if len(self.fed) == 3:
                os.kill(os.getpid(), signal.SIGINT)  # as if the user pressed Ctrl-C mid-token
            return token

    engine = InterruptingEngine([ord(c) for c in "abcdefgh"])
    session = Session(engine, CharCodec())
    text, _ = run(session, "q")
    assert text == "abc" and session.stats.finish_reason == "interrupted"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert run(session, "r", max_tokens=2)[0] == "de"


def test_bad_arguments_are_named():
    session = Session(ScriptedEngine([1]), CharCodec())
    with pytest.raises(strata.InvalidArgument, match="prompt is empty"):
        session.generate("")
    with pytest.raises(strata.InvalidArgument, match="max_tokens must be >= 1"):
        session.generate("q", max_tokens=0)
    with pytest.raises(strata.InvalidArgument, match="top_p must be in"):
        session.generate("q", top_p=2.0)


def test_the_reference_engine_generates_what_its_logits_and_the_sampler_say(tmp_path, rng):
    path = tmp_path / "tiny.gguf"
    synthesize(path, "qwen3next", "tiny", n_layer=4, seed=2)
    with inspect(path) as model:
        tokenizer = model.tokenizer()
        session = Session(ReferenceEngine(Reference(model), context=64), tokenizer)
        prompt = [int(t) for t in rng.integers(0, model.geometry.n_vocab - 1, 6)]
        seed = int(rng.integers(1 << 31))
        pieces = list(session.generate(prompt, max_tokens=5, temperature=0.8, top_k=20, seed=seed))
        # Replay with a fresh reference: the same logits and the same draws give the same tokens.
        replay, draws, fed = Reference(model), np.random.default_rng(seed), list(prompt)
        params = SamplingParams(0.8, 20)
        want, logits = [], replay.forward(prompt)[-1]
        for piece in pieces:
            want.append(sample(logits, params, draws.random(), fed))
            fed.append(want[-1])
            logits = replay.forward([want[-1]])[-1]
        assert [p.token for p in pieces] == want


class ChatCodec(CharCodec):
    chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                     "{% if add_generation_prompt %}<assistant>{% endif %}{{ eos_token }}")
    tokens = [chr(i) for i in range(256)]
    special_ids = {"eos": [ord("$")]}
    eos_ids = [0]


def test_chat_renders_the_template_and_starts_over_each_turn():
    engine = ScriptedEngine([ord("o"), ord("k"), 0, ord("!"), 0])
    session = Session(engine, ChatCodec())
    history = [{"role": "user", "content": "hi"}]
    assert "".join(p.text for p in session.chat(history)) == "ok"
    assert CharCodec().decode(engine.fed[0]) == "<user>hi<assistant>$"
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}]
    assert "".join(p.text for p in session.chat(history)) == "!"
    # reset() between turns: the engine saw the whole conversation again, not the pending EOS of turn one.
    assert CharCodec().decode(engine.fed[0]) == "<user>hi<assistant>ok<user>go<assistant>$"


def test_chat_without_a_template_is_a_format_error():
    with pytest.raises(strata.FormatError, match="no chat template"):
        Session(ScriptedEngine([0]), CharCodec()).chat([{"role": "user", "content": "x"}])


def test_the_chat_loop_keeps_the_history_and_obeys_its_commands():
    import io

    from strata.cli.chat import converse

    class Recording(ScriptedEngine):
        prompts: list = []

        def feed(self, ids, params, u, seen):
            if len(ids) > 1:
                self.prompts.append(CharCodec().decode(ids))
            return super().feed(ids, params, u, seen)

    engine = Recording([ord("A"), 0, ord("B"), 0, ord("C"), 0])
    out = io.StringIO()
    converse(Session(engine, ChatCodec()), ["hi\n", "again\n", "/reset\n", "new\n", "/exit\n", "never\n"], out)
    text = out.getvalue()
    assert text.count("> ") == 5 and "A\n" in text and "B\n" in text and "(conversation cleared)" in text
    assert engine.prompts == ["<user>hi<assistant>$", "<user>hi<assistant>A<user>again<assistant>$",
                              "<user>new<assistant>$"]
