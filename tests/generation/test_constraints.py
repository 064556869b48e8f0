"""Structured output (strata.generation.constraints, the token mask of strata.sampling): on the reference engine over
a tiny random model, whose text unconstrained is noise, every answer to a corpus of JSON schemas parses and
validates, greedy and for every seed; regular expressions and GBNF grammars hold; a grammar that allows nothing but
EOS ends at once; logprobs are over the allowed tokens; drafts are cut to what the grammar accepts and verified
under each row's mask; batched members each keep their own constraint; what cannot be enforced is refused by name
before anything runs."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from strata.errors import InvalidArgument, StrataError
from strata.generation import Session
from strata.generation.arguments import OptionRefused
from strata.generation.batcher import Batcher
from strata.generation.constraints import compile_constraint, compile_grammar
from strata.generation.drafts import ForcedDrafter
from strata.reference import Reference
from strata.reference.engine import ReferenceEngine
from strata.sampling import SamplingParams, TokenMask, log_probabilities, sample, verify_drafts
from support.batch_engine import AlwaysBatch, BatchingReference, BatchLog
from support.char_engine import ScriptedEngine

pytest.importorskip("llguidance")

CONTEXT = 512
MAX_TOKENS = 400
SEEDS = range(4)
SHORT = {"type": "string", "maxLength": 6}

CORPUS = {
    "flat, required and optional": {
        "type": "object", "additionalProperties": False, "required": ["name", "age"],
        "properties": {"name": SHORT, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                       "admin": {"type": "boolean"}, "nickname": {"type": ["string", "null"], "maxLength": 4}}},
    "nested objects": {
        "type": "object", "additionalProperties": False, "required": ["outer"],
        "properties": {"outer": {
            "type": "object", "additionalProperties": False, "required": ["inner", "id"],
            "properties": {"id": {"type": "integer"}, "inner": {
                "type": "object", "additionalProperties": False, "required": ["ok"],
                "properties": {"ok": {"type": "boolean"}, "note": SHORT}}}}}},
    "arrays": {
        "type": "object", "additionalProperties": False, "required": ["points", "labels"],
        "properties": {
            "points": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
                "type": "object", "additionalProperties": False, "required": ["x", "y"],
                "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
                               "y": {"type": "integer", "minimum": -9, "maximum": 9}}}},
            "labels": {"type": "array", "maxItems": 4, "items": SHORT}}},
    "enums and consts": {
        "type": "object", "additionalProperties": False, "required": ["color", "mixed", "kind"],
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "mixed": {"enum": [1, "two", None, True]},
                       "kind": {"const": "point"}}},
    "numbers": {
        "type": "object", "additionalProperties": False, "required": ["ratio", "count", "temp"],
        "properties": {"ratio": {"type": "number", "minimum": 0, "maximum": 1},
                       "count": {"type": "integer", "exclusiveMinimum": 0, "maximum": 1000},
                       "temp": {"type": "number", "minimum": -40.5, "maximum": 60}}},
    "patterns": {
        "type": "object", "additionalProperties": False, "required": ["code", "date", "word"],
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
                       "date": {"type": "string", "pattern": "^20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9])$"},
                       "word": {"type": "string", "minLength": 2, "maxLength": 5, "pattern": "^[a-z]+$"}}},
    "anyOf": {
        "type": "object", "additionalProperties": False, "required": ["value"],
        "properties": {"value": {"anyOf": [
            {"type": "integer", "minimum": 0, "maximum": 99},
            {"type": "object", "additionalProperties": False, "required": ["text"], "properties": {"text": SHORT}},
            {"type": "array", "maxItems": 2, "items": {"type": "boolean"}}, {"type": "null"}]}}},
    "definitions and references": {
        "$defs": {"Pet": {"type": "object", "additionalProperties": False, "required": ["name", "species"],
                          "properties": {"name": SHORT, "species": {"enum": ["cat", "dog"]}}}},
        "type": "object", "additionalProperties": False, "required": ["owner", "pets"],
        "properties": {"owner": SHORT, "pets": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/Pet"}},
                       "favourite": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}]}}},
}


@pytest.fixture(scope="module")
def model_file(tiny_model):
    from strata.format import ModelFile

    with ModelFile(tiny_model("qwen3next", seed=4)) as file:
        yield file


@pytest.fixture(scope="module")
def codec(model_file):
    return model_file.tokenizer()


def reference(model_file, **options) -> ReferenceEngine:
    return ReferenceEngine(Reference(model_file), CONTEXT, **options)


@pytest.fixture(scope="module")
def session(model_file, codec):
    return Session(reference(model_file), codec)


def settings(seed: int | None) -> dict:
    """Greedy (None), or sampled from `seed` at temperature 1 with the filters on in turn."""
    if seed is None:
        return {"temperature": 0.0}
    return {"temperature": 1.0, "seed": seed, **[{}, {"top_k": 40}, {"top_p": 0.9}, {"min_p": 0.05}][seed % 4]}


# ---------------------------------------------------------------------------------------------- the sampler


def test_a_token_mask_keeps_every_draw_and_filter_to_the_allowed_tokens(rng):
    logits = rng.standard_normal(70).astype(np.float32) * 3
    allowed = [3, 17, 40, 69]
    mask = TokenMask.allowing(allowed, 70)
    assert mask.size == 3 and list(np.nonzero(mask.allowed(70))[0]) == allowed
    assert not mask.allowed(100)[70:].any()  # past the words' bits nothing is allowed
    greedy = SamplingParams(token_mask=mask)
    assert sample(logits, greedy, 0.5) == max(allowed, key=lambda t: logits[t])
    for params in (SamplingParams(temperature=1.0, token_mask=mask), SamplingParams(temperature=0.7, top_k=2,
                                                                                     token_mask=mask)):
        drawn = {sample(logits, params, u) for u in np.linspace(0, 0.999999, 200)}
        assert drawn <= set(allowed) and len(drawn) >= 2
    assert SamplingParams(token_mask=mask) == SamplingParams()  # the mask is not part of the parameters' identity
    with pytest.raises(InvalidArgument, match="allows no token"):
        sample(logits, SamplingParams(token_mask=TokenMask.allowing([], 70)), 0.5)
    with pytest.raises(InvalidArgument, match="TokenMask"):
        SamplingParams(token_mask=np.ones(3, np.int32))


def test_a_mask_computed_late_is_computed_once_into_the_engines_buffer():
    calls = []

    def compute(out):
        calls.append(out.size)
        out[:] = [5, 0]

    mask = TokenMask(size=2, compute=compute)
    buffer = np.full(4, -1, np.int32)  # an engine's buffer may be wider than the vocabulary's words
    mask.fill(buffer)
    assert list(buffer) == [5, 0, 0, 0] and calls == [2]
    assert list(mask.words) == [5, 0] and list(np.nonzero(mask.allowed(64))[0]) == [0, 2] and calls == [2]
    with pytest.raises(InvalidArgument, match="int32"):
        mask.fill(np.zeros(4, np.int64))


def test_logprobs_under_a_mask_are_over_the_allowed_tokens(rng):
    logits = rng.standard_normal(40)
    mask = TokenMask.allowing([2, 9, 30], 40)
    logprob, top = log_probabilities(logits, 9, 5, mask)
    assert [t for t, _ in top] == sorted([2, 9, 30], key=lambda t: -logits[t])  # only allowed ones, fewer than 5
    assert np.isclose(sum(np.exp(lp) for _, lp in top), 1.0) and dict(top)[9] == logprob
    raw, _ = log_probabilities(logits, 9, 5)
    assert logprob > raw
    with pytest.raises(InvalidArgument, match="not one the token mask allows"):
        log_probabilities(logits, 3, 5, mask)


def test_verification_rows_each_take_their_own_mask(rng):
    rows = rng.standard_normal((3, 20)).astype(np.float32)
    drafts = [int(np.argmax(rows[0])), 4]
    masks = [TokenMask.allowing(range(20), 20), TokenMask.allowing([4], 20), TokenMask.allowing([7, 8], 20)]
    produced = verify_drafts(rows, SamplingParams(), drafts, np.zeros((3, 2)), (), None, masks)
    assert produced == [drafts[0], 4, max((7, 8), key=lambda t: rows[2, t])]
    masks[1] = TokenMask.allowing([5], 20)  # the second draft is not allowed: its row yields the allowed token
    assert verify_drafts(rows, SamplingParams(), drafts, np.zeros((3, 2)), (), None, masks) == [drafts[0], 5]
    with pytest.raises(InvalidArgument, match="3 token masks"):
        verify_drafts(rows, SamplingParams(), drafts, np.zeros((3, 2)), (), None, masks[:2])


# ---------------------------------------------------------------------------------------------- the corpus


@pytest.mark.parametrize("name", list(CORPUS))
def test_every_answer_to_a_schema_parses_and_validates_greedy_and_for_every_seed(session, name):
    schema = CORPUS[name]
    validator = jsonschema.Draft202012Validator(schema)
    grammar = compile_constraint(session.codec, "json_schema", schema)  # compiled once, used by every call
    for seed in (None, *SEEDS):
        answer = session.complete("Write it down:", MAX_TOKENS, json_schema=grammar, **settings(seed))
        assert answer.finish_reason == "eos", (seed, answer.text)
        validator.validate(json.loads(answer.text))


def test_unconstrained_the_model_writes_noise(session):
    """What the corpus's answers are forced from: the same prompt without a schema is no JSON."""
    for seed in SEEDS:
        text = session.complete("Write it down:", 40, temperature=1.0, seed=seed).text
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)


def test_response_format_json_object_and_json_schema_and_text(session):
    for seed in SEEDS:
        answer = session.complete("{", MAX_TOKENS, response_format={"type": "json_object"}, temperature=1.0,
                                  seed=seed, logit_bias={ord('"'): 3.0, ord("}"): 3.0})
        assert answer.finish_reason == "eos" and isinstance(json.loads(answer.text), dict), answer.text
    schema = CORPUS["enums and consts"]
    answer = session.complete("x", MAX_TOKENS, response_format={
        "type": "json_schema", "json_schema": {"name": "thing", "strict": True, "schema": schema}})
    jsonschema.validate(json.loads(answer.text), schema)
    free = session.complete("x", 8, response_format={"type": "text"}, temperature=0.0)
    assert free.text == session.complete("x", 8, temperature=0.0).text


def test_regular_expressions_and_gbnf_grammars_hold(session):
    pattern = r"(yes|no|maybe), [0-9]{1,3}(\.[0-9])?"
    gbnf = '''root ::= "[" item ("," item){0,3} "]"
item ::= [a-c]+ | "null"
'''
    for seed in (None, *SEEDS):
        answer = session.complete("q", MAX_TOKENS, regex=pattern, **settings(seed))
        assert answer.finish_reason == "eos" and re.fullmatch(pattern, answer.text), answer.text
        listed = session.complete("q", MAX_TOKENS, grammar=gbnf, **settings(seed))
        assert listed.finish_reason == "eos" and re.fullmatch(r"\[([a-c]+|null)(,([a-c]+|null)){0,3}\]",
                                                              listed.text), listed.text


def test_a_grammar_that_allows_only_eos_ends_at_once_and_the_session_goes_on(session):
    answer = session.complete("hello", 20, grammar='root ::= ""', temperature=1.0, seed=1)
    assert answer.text == "" and answer.tokens == () and answer.finish_reason == "eos"
    assert session.stats.finish_reason == "eos" and answer.usage.completion_tokens == 0
    assert session.tokens[-1] in session.codec.eos_ids  # the EOS drawn is the session's pending token
    after = session.complete("hello", 5, regex="ab", logprobs=2)
    assert after.text == "ab" and after.finish_reason == "eos"
    assert all(p.logprob == 0.0 and len(p.top_logprobs) == 1 for p in after.pieces)  # one token allowed: certain


def test_logprobs_of_a_constrained_answer_are_over_the_allowed_tokens(session):
    answer = session.complete("q", 10, regex="(yes|no)!", logprobs=5, temperature=1.0, seed=2)
    first = answer.pieces[0]
    assert answer.text in ("yes!", "no!") and {t for t, _ in first.top_logprobs} <= {ord("y"), ord("n")}
    assert np.isclose(sum(np.exp(lp) for _, lp in first.top_logprobs), 1.0)
    assert all(p.logprob <= 0 for p in answer.pieces)


def test_a_text_grammar_and_the_chat_template(session):
    """A chat's answer under a schema: the template's turn, then the JSON, then the turn's end."""
    session.codec.chat_template  # noqa: B018 - the tiny model carries ChatML
    schema = CORPUS["flat, required and optional"]
    answer = session.chat_complete([{"role": "user", "content": "Who?"}], MAX_TOKENS, json_schema=schema,
                                   temperature=1.0, seed=5)
    jsonschema.validate(json.loads(answer.text), schema)


# ---------------------------------------------------------------------------------------------- drafts


class Verifies(ReferenceEngine):
    """The reference, recording each verify's ids and the sequence with them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.verified = []

    def verify(self, ids, seen):
        self.verified.append((list(ids), list(seen)))
        return super().verify(ids, seen)


def test_drafts_under_a_grammar_are_cut_to_what_it_accepts_and_verified_under_each_rows_mask(model_file, codec):
    """Drafting stays on under a grammar: right drafts (the constrained answer) are accepted, wrong ones are cut to
    the prefix the grammar accepts before the verify; greedy, the answer is stepping's, sampled a valid one."""
    schema = CORPUS["arrays"]
    grammar = compile_constraint(codec, "json_schema", schema)
    alone = Session(reference(model_file), codec)
    prompt = codec.encode("Points:")
    for seed in (None, 3):
        expected = alone.complete(prompt, MAX_TOKENS, json_schema=schema, **settings(seed))
        continuation = prompt + list(expected.tokens)
        for p in (1.0, 0.5, 0.0):
            drafter = ForcedDrafter(continuation, p, seed=7, vocab=len(codec.tokens))
            engine = Verifies(Reference(model_file), CONTEXT)
            drafted = Session(engine, codec, drafter, 4)
            answer = drafted.complete(prompt, MAX_TOKENS, json_schema=schema, **settings(seed))
            if seed is None:  # sampled, a verify draws its uniforms otherwise than steps: the same distribution only
                assert answer.tokens == expected.tokens, p
            jsonschema.validate(json.loads(answer.text), schema)
            stats = drafted.stats
            # every verify's ids (the pending token and its drafts) continue the answer as the grammar allows
            assert sum(len(ids) - 1 for ids, _ in engine.verified) == stats.drafted and (engine.verified or p == 0.0)
            for ids, seen in engine.verified:
                answer_so_far = seen[len(prompt):]
                assert grammar.start().valid_prefix(answer_so_far) == len(answer_so_far)
            if p == 1.0:
                assert stats.drafted > 0 and (seed is not None or stats.accepted == stats.drafted)
            if p == 0.0 and seed is None:
                assert stats.accepted == 0


# ---------------------------------------------------------------------------------------------- batched sessions


class MaskLog(BatchingReference):
    """The reference with the batched step, recording whether each draw came with a token mask."""

    def feed(self, ids, params, u, seen):
        self.log.calls.append((self, "mask" if params.token_mask is not None else "none", len(ids)))
        return super().feed(ids, params, u, seen)


def test_batched_members_each_keep_their_own_constraint_and_the_others_pay_nothing(model_file, codec):
    schema, pattern = CORPUS["numbers"], "[a-f]{3,9}"
    prompts = [codec.encode("one"), codec.encode("two"), codec.encode("three")]
    options = [{"json_schema": schema}, {"regex": pattern}, {}]
    alone = [Session(reference(model_file), codec).complete(p, 60, temperature=1.0, seed=i, **o).tokens
             for i, (p, o) in enumerate(zip(prompts, options))]
    log = BatchLog()
    with Batcher(grace_seconds=0.05, policy=AlwaysBatch()) as batcher:
        engines = [MaskLog(Reference(model_file), CONTEXT, log=log) for _ in prompts]
        sessions = [Session(batcher.member(e), codec) for e in engines]
        from concurrent.futures import ThreadPoolExecutor

        def run(i):
            with sessions[i].engine.active():
                return sessions[i].complete(prompts[i], 60, temperature=1.0, seed=i, **options[i]).tokens

        with ThreadPoolExecutor(3) as pool:
            together = list(pool.map(run, range(3)))
    assert together == alone
    assert max(log.sizes) > 1
    masked = {e: {kind for engine, kind, _ in log.calls if engine is e} for e in engines}
    assert masked[engines[0]] == {"mask"} and masked[engines[1]] == {"mask"} and masked[engines[2]] == {"none"}
    jsonschema.validate(json.loads(codec.decode(list(together[0][:-1]) if together[0][-1] in codec.eos_ids
                                                else list(together[0]))), schema)


# ---------------------------------------------------------------------------------------------- refusals


class NoMask(ScriptedEngine):
    """An engine whose sampler takes no mask (as the GPU engine's, for now)."""


def test_an_engine_that_cannot_mask_refuses_each_constraint_by_name(codec):
    session = Session(NoMask([1, 2, 3], context=64), codec)
    for option, value in (("json_schema", {"type": "object"}), ("regex", "a+"), ("grammar", 'root ::= "a"'),
                          ("response_format", {"type": "json_object"})):
        with pytest.raises(OptionRefused, match="token mask") as refused:
            session.complete("hi", 4, **{option: value})
        assert refused.value.option == option
    session.complete("hi", 2, response_format={"type": "text"})  # text constrains nothing: taken


def test_what_cannot_be_enforced_is_refused_by_name_before_anything_runs(session):
    engine = session.engine
    before = engine.position
    cases = [
        ({"json_schema": {"type": "object", "if": {"required": ["a"]}}}, "json_schema", r'\["if"\]'),
        ({"json_schema": {"type": "array", "uniqueItems": True}}, "json_schema", "uniqueItems"),
        ({"json_schema": {"type": "string", "pattern": "(?=a)b"}}, "json_schema", "look-around"),
        ({"json_schema": "{not json"}, "json_schema", "not JSON"),
        ({"json_schema": [1]}, "json_schema", "is an object"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"not": {}}}}}, "response_format",
         "not"),
        ({"response_format": {"type": "xml"}}, "response_format", "text, json_object or json_schema"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema object"),
        ({"regex": "(unclosed"}, "regex", "unclosed group"),
        ({"grammar": "root ::= missing"}, "grammar", "missing"),
        ({"grammar": "no rules here"}, "grammar", "GBNF"),
        ({"regex": "a", "grammar": 'root ::= "a"'}, "regex", "one constraint"),
        ({"regex": "a", "ignore_eos": True}, "ignore_eos", "where the answer ends"),
        ({"json_schema": {"$ref": "#"}}, "json_schema", "allows no answer"),
        ({"grammar": 'root ::= root "a"'}, "grammar", "allows no answer"),
        ({"regex": "a" * 70_000}, "regex", "70000 characters; at most 65536"),
        ({"grammar": "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(3000)) + 'r3000 ::= "a"\n'},
         None, None),  # a chain of 3,000 rules, which overflowed an 8 MiB stack: built on the builder's deep one
    ]
    for options, option, words in cases:
        if option is None:
            continue
        with pytest.raises(OptionRefused, match=words) as refused:
            session.complete("hi", 4, **options)
        assert refused.value.option == option, options
    assert engine.position == before  # nothing was fed
    assert session.complete("hi", 4, **cases[-1][0]).text == "a"


def test_a_grammar_the_engine_cannot_follow_to_its_end_is_refused_where_it_stops(session):
    """A schema that nests itself without end: llguidance's parser meets its limit after the first token."""
    schema = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
    with pytest.raises(OptionRefused, match="cannot go on") as refused:
        session.complete("hi", 20, json_schema=schema)
    assert refused.value.option == "json_schema" and session.stats.finish_reason == "error"
    assert session.complete("hi", 3, regex="abc").text == "abc"


def test_a_grammar_compiled_for_another_vocabulary_is_refused(session):
    class Small:
        tokens = [chr(i) for i in range(300)]
        eos_ids = [0]
        control_tokens = ()

        def encode(self, text):
            return [ord(c) for c in text]

        def decode(self, ids):
            return "".join(map(chr, ids))

    other = compile_grammar(Small(), "regex", "a+", "regex")
    with pytest.raises(OptionRefused, match="vocabulary of 300"):
        session.complete("hi", 4, grammar=other)


class Unmasked(ReferenceEngine):
    """An engine that says it masks but samples as if it did not: the session notices the first token out."""

    def feed(self, ids, params, u, seen):
        return super().feed(ids, SamplingParams(temperature=params.temperature), u, seen)


def test_an_engine_that_ignores_the_mask_is_caught_at_the_first_token_out(model_file, codec):
    session = Session(Unmasked(Reference(model_file), CONTEXT), codec)
    with pytest.raises(StrataError, match="does not allow"):
        session.complete("hi", 20, regex="z{5}")
    assert session.stats.finish_reason == "error"
    assert session.complete("hi", 3, temperature=0.0).finish_reason in ("length", "eos")
