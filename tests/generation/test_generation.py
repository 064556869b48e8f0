"""Generation over an engine: streaming, stops, carry-over, prefix reuse with snapshots, streams left early,
one call at a time, Ctrl-C at a token boundary, logprobs, the non-streaming call."""

import os
import signal
import threading

import numpy as np
import pytest

import strata
from strata.format import inspect
from strata.generation import Session
from strata.reference import Reference
from strata.reference.engine import ReferenceEngine
from strata.sampling import SamplingParams, sample
from strata.synth import synthesize
from support.char_engine import CharCodec, ScriptedEngine, TurnCodec


class SnapshotEngine(ScriptedEngine):
    """A scripted engine that keeps snapshots of its position (the state a real engine would copy)."""

    snapshots = 2

    def __init__(self, script, context=64):
        super().__init__(script, context)
        self.saved, self.restored = {}, []

    def prefill(self, ids, seen):
        self.fed.append(list(ids))
        self.position += len(ids)

    def snapshot(self, slot):
        self.saved[slot] = self.position

    def restore(self, slot):
        self.position = self.saved[slot]
        self.restored.append(slot)


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


def test_a_stream_left_early_leaves_the_session_holding_what_the_caller_received():
    engine = ScriptedEngine([ord(c) for c in "abcdef"])
    session = Session(engine, CharCodec())
    for piece in session.generate("q"):
        if piece.text == "b":
            break  # the caller holds "ab"
    assert session.stats.finish_reason == "cancelled" and session.tokens == [ord(c) for c in "qab"]
    assert run(session, "!", max_tokens=1)[0] == "c"
    assert engine.fed == [[ord("q")], [ord("a")], [ord("b"), ord("!")]]  # b, never fed before, goes first


def test_an_exception_in_the_consumer_loses_nothing():
    session = Session(ScriptedEngine([ord(c) for c in "abc"]), CharCodec())
    with pytest.raises(RuntimeError):
        for _ in session.generate("q"):
            raise RuntimeError("the consumer broke")
    assert session.stats.finish_reason == "cancelled" and session.tokens == [ord("q"), ord("a")]


def test_an_abandoned_stream_never_blocks_the_next_call_of_its_thread():
    session = Session(ScriptedEngine([ord("a")] * 10), CharCodec())
    first = session.generate("q")
    next(first)
    assert run(session, "r", max_tokens=1)[0] == "a"  # first is closed: its token "a" was pending, then fed
    assert list(first) == [] and session.tokens == [ord(c) for c in "qara"]
    abandoned = session.generate("s")
    session.reset()  # closes it too
    assert session.tokens == [] and list(abandoned) == []


def test_one_call_at_a_time_across_threads():
    session = Session(ScriptedEngine([ord("a")] * 10), CharCodec())
    first = session.generate("q")
    next(first)
    errors = []

    def other():
        try:
            next(session.generate("r"))
        except strata.StrataError as error:
            errors.append(str(error))

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert errors and "already generating" in errors[0]
    first.close()
    assert run(session, "q", max_tokens=1)[0] == "a"


class InterruptingEngine(ScriptedEngine):
    """Sends SIGINT to this process while its `at`-th feed computes, as if the user pressed Ctrl-C mid-token."""

    def __init__(self, script, at):
        super().__init__(script)
        self.at = at

    def feed(self, ids, params, u, seen):
        token = super().feed(ids, params, u, seen)
        if len(self.fed) == self.at:
            os.kill(os.getpid(), signal.SIGINT)
        return token


def test_ctrl_c_stops_at_a_token_boundary_then_raises_and_the_session_stays_usable():
    engine = InterruptingEngine([ord(c) for c in "abcdefgh"], at=3)
    session = Session(engine, CharCodec())
    shown = []
    with pytest.raises(KeyboardInterrupt):
        for piece in session.generate("q"):
            shown.append(piece.text)
    text = "".join(shown)
    assert text == "abc" and session.stats.finish_reason == "interrupted"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    # What was shown is what the session holds: the prompt and the three tokens, the last one still to feed.
    assert CharCodec().decode(session.tokens) == "qabc"
    assert run(session, "r", max_tokens=2)[0] == "de"
    assert CharCodec().decode(engine.fed[-2]) == "cr"


@pytest.mark.parametrize("call", ["generate", "complete", "chat_complete"])
def test_ctrl_c_propagates_from_every_call(call):
    session = Session(InterruptingEngine([ord(c) for c in "abcdefgh"], at=2), TurnCodec())
    argument = [{"role": "user", "content": "q"}] if call == "chat_complete" else "q"
    with pytest.raises(KeyboardInterrupt):
        result = getattr(session, call)(argument)
        list(result) if call == "generate" else None
    assert session.stats.finish_reason == "interrupted" and session.stats.generated_tokens == 2
    assert CharCodec().decode(session.tokens).endswith("ab")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_while_the_caller_holds_a_piece_is_the_callers():
    session = Session(ScriptedEngine([ord(c) for c in "abcdefgh"]), CharCodec())
    stream = session.generate("q")
    assert next(stream).text == "a"
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)  # between tokens: the stream is suspended, the program's handler runs
    stream.close()
    assert session.stats.finish_reason == "cancelled" and CharCodec().decode(session.tokens) == "qa"


def test_a_handler_the_caller_sets_while_holding_a_piece_is_the_programs_after():
    """The session's handler stays installed through the call; a handler the caller sets while it holds a piece
    takes the caller's Ctrl-C from then on, and is the program's again when the call ends."""
    session = Session(ScriptedEngine([ord(c) for c in "abcdefgh"]), CharCodec())
    stream = session.generate("q", max_tokens=4)
    assert next(stream).text == "a"
    seen = []

    def mine(signum, frame):
        seen.append(signum)

    before = signal.signal(signal.SIGINT, mine)
    try:
        rest = []
        for piece in stream:
            os.kill(os.getpid(), signal.SIGINT)  # with the caller: its own handler's
            rest.append(piece.text)
        assert "".join(rest) == "bcd" and seen == [signal.SIGINT] * 3
        assert signal.getsignal(signal.SIGINT) is mine and session.stats.finish_reason == "length"
    finally:
        signal.signal(signal.SIGINT, before)


def test_an_ignored_ctrl_c_stays_ignored_while_the_caller_holds_a_piece():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        session = Session(ScriptedEngine([ord(c) for c in "abcdefgh"]), CharCodec())
        shown = []
        for piece in session.generate("q", max_tokens=3):
            os.kill(os.getpid(), signal.SIGINT)
            shown.append(piece.text)
        assert "".join(shown) == "abc" and session.stats.finish_reason == "length"
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_bad_arguments_are_named():
    session = Session(ScriptedEngine([1]), CharCodec())
    with pytest.raises(strata.InvalidArgument, match="prompt is empty"):
        session.generate("")
    with pytest.raises(strata.InvalidArgument, match="max_tokens must be >= 1"):
        session.generate("q", max_tokens=0)
    with pytest.raises(strata.InvalidArgument, match="top_p must be in"):
        session.generate("q", top_p=2.0)
    with pytest.raises(strata.InvalidArgument, match="stop must be a string or a list of strings"):
        session.generate("q", stop=[3])
    with pytest.raises(strata.InvalidArgument, match="does not report log-probabilities"):
        session.generate("q", logprobs=2)


def test_stop_may_be_one_string_and_max_tokens_none_runs_to_eos():
    session = Session(ScriptedEngine([ord(c) for c in "abcdef"] + [0]), CharCodec())
    assert run(session, "q", stop="cd")[0] == "ab" and session.stats.finish_reason == "stop"
    session = Session(ScriptedEngine([ord("a")] * 300 + [0], context=400), CharCodec())
    assert run(session, "q", max_tokens=None)[0] == "a" * 300 and session.stats.finish_reason == "eos"


def test_complete_returns_text_reason_and_usage():
    session = Session(SnapshotEngine([ord(c) for c in "hi"] + [0] + [ord("!"), 0]), CharCodec())
    done = session.complete("ab")
    assert (done.text, done.tokens, done.finish_reason) == ("hi", (ord("h"), ord("i")), "eos")
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.cached_tokens) == (2, 2, 0)
    # The whole sequence again, extended: only the new part is fed.
    again = session.complete("abhi" + chr(0) + "c")
    assert again.text == "!" and again.usage.cached_tokens == 4 and again.usage.total_tokens == 7


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


def test_chat_renders_the_template_and_starts_over_where_the_conversation_differs():
    engine = ScriptedEngine([ord("o"), ord("k"), 0, ord("!"), 0])
    session = Session(engine, ChatCodec())
    history = [{"role": "user", "content": "hi"}]
    assert "".join(p.text for p in session.chat(history)) == "ok"
    assert CharCodec().decode(engine.fed[0]) == "<user>hi<assistant>$"
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}]
    assert "".join(p.text for p in session.chat(history)) == "!"
    # This template ends every prompt with "$", so turn two differs from what the engine holds right after
    # "<user>hi<assistant>"; with no snapshot to go back to, the engine starts over (reset clears `fed`).
    assert CharCodec().decode(engine.fed[0]) == "<user>hi<assistant>ok<user>go<assistant>$"


def test_a_conversation_that_continues_feeds_only_each_turns_new_tokens():
    engine = SnapshotEngine([ord("o"), ord("k"), 0, ord("!"), 0])
    session = Session(engine, TurnCodec())
    history = [{"role": "user", "content": "hi"}]
    assert "".join(p.text for p in session.chat(history)) == "ok"
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}]
    assert "".join(p.text for p in session.chat(history)) == "!"
    decode = CharCodec().decode
    # Each prompt in two parts: all but its last token, a snapshot, the last token (whose logits give the answer).
    assert [decode(ids) for ids in engine.fed] == ["<user>hi\0<assistant", ">", "o", "k",
                                                   "\0<user>go\0<assistant", ">", "!"]
    assert session.stats.cached_tokens == len("<user>hi\0<assistant>ok") and engine.restored == []


def test_a_conversation_that_diverges_rolls_back_to_the_last_turn_boundary():
    engine = SnapshotEngine([ord("o"), ord("k"), 0, ord("!"), 0])
    session = Session(engine, TurnCodec())
    history = [{"role": "user", "content": "hi"}]
    list(session.chat(history))
    history += [{"role": "assistant", "content": "OK"}, {"role": "user", "content": "go"}]  # the answer, edited
    list(session.chat(history))
    decode = CharCodec().decode
    # Back to the snapshot before turn one's last prompt token, then the rest: the edited answer, the new turn.
    assert engine.restored == [0] and decode(engine.fed[-3]) == ">OK\0<user>go\0<assistant"
    assert engine.position == len("<user>hi\0<assistant>OK\0<user>go\0<assistant>!")


def test_template_options_reach_the_template():
    codec = TurnCodec()
    codec.chat_template = "{% if enable_thinking %}<think>{% endif %}{{ messages[0]['content'] }}"
    session = Session(ScriptedEngine([0]), codec)
    assert session.render([{"role": "user", "content": "x"}], {"enable_thinking": True}) == "<think>x"


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


def test_ctrl_c_in_the_chat_loop_ends_the_answer_and_the_conversation_goes_on():
    import io

    from strata.cli.chat import converse

    engine = InterruptingEngine([ord("A"), ord("B"), ord("C"), ord("D"), 0], at=2)
    out = io.StringIO()
    session = Session(engine, ChatCodec())
    converse(session, ["hi\n", "again\n"], out)
    assert "AB\n" in out.getvalue() and out.getvalue().count("> ") == 3
    # The second turn carries the interrupted answer as it was shown.
    assert CharCodec().decode(session.tokens).startswith("<user>hi<assistant>AB<user>again<assistant>$CD")


class SamplingEngine(ScriptedEngine):
    """A scripted engine whose sampler would apply every option (full_sampling); records the params it is fed."""

    full_sampling = True

    def __init__(self, script, context=64):
        super().__init__(script, context)
        self.params = []

    def feed(self, ids, params, u, seen):
        self.params.append(params)
        return super().feed(ids, params, u, seen)


def test_bias_and_penalties_reach_an_engine_that_applies_them_with_the_answers_start():
    engine = SamplingEngine([ord("a"), ord("b"), 0])
    session = Session(engine, TurnCodec())
    assert run(session, "xyz", logit_bias={5: -2}, frequency_penalty=0.5,
               presence_penalty=-0.25)[0] == "ab"
    first = engine.params[0]
    assert (first.logit_bias, first.frequency_penalty, first.presence_penalty) == (((5, -2.0),), 0.5, -0.25)
    assert {p.answer_start for p in engine.params} == {3}  # the sequence before the answer: the prompt
    with pytest.raises(strata.InvalidArgument, match="logit_bias: token id 300 is outside the vocabulary 0..255"):
        session.generate("q", logit_bias={300: 1})


@pytest.mark.parametrize("option, value", [("logit_bias", {5: 1.0}), ("frequency_penalty", 0.5),
                                           ("presence_penalty", -1.0)])
def test_an_engine_whose_sampler_lacks_an_option_refuses_it_by_name(option, value):
    from strata.generation.arguments import OptionRefused

    session = Session(ScriptedEngine([1]), TurnCodec())
    with pytest.raises(OptionRefused, match=f"{option}: this engine's sampler does not apply it") as refused:
        session.generate("q", **{option: value})
    assert refused.value.option == option
    assert run(session, "q", **{option: {} if option == "logit_bias" else 0.0}, max_tokens=1)[0] == chr(1)


def test_ignore_eos_runs_past_eos_to_max_tokens():
    session = Session(ScriptedEngine([ord("a"), 0, ord("b"), 0]), CharCodec())
    assert run(session, "q", max_tokens=3, ignore_eos=True)[1] == [ord("a"), 0, ord("b")]
    assert session.stats.finish_reason == "length"


def test_the_reference_applies_the_penalties_over_the_answer(tmp_path):
    path = tmp_path / "tiny.gguf"
    synthesize(path, "qwen3next", "tiny", n_layer=2, seed=3)
    with inspect(path) as model:
        tokenizer = model.tokenizer()
        session = Session(ReferenceEngine(Reference(model), context=64), tokenizer)
        prompt = [5, 9, 5, 9]
        pieces = list(session.generate(prompt, max_tokens=6, frequency_penalty=2.0, presence_penalty=1.0,
                                       logit_bias={3: 5.0}))
        replay, fed = Reference(model), list(prompt)
        params = SamplingParams(frequency_penalty=2.0, presence_penalty=1.0, logit_bias={3: 5.0}, answer_start=4)
        want, logits = [], replay.forward(prompt)[-1]
        for _ in pieces:
            want.append(sample(logits, params, 0.5, fed))
            fed.append(want[-1])
            logits = replay.forward([want[-1]])[-1]
        assert [p.token for p in pieces] == want
