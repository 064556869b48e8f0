"""Structured output: JSON schemas, regular expressions and grammars enforced while decoding.

A constraint is compiled once against the model's tokenizer (`compile_constraint`: a `Grammar`) and started for
each generation (`Grammar.start()`: a `Constraint`, the parser's state). Before each draw the session asks the
state for the tokens it allows next (`Constraint.mask()`, a strata.sampling.TokenMask handed to the engine with the
sampling parameters), and advances it by the token drawn; where the grammar is complete only EOS is allowed, so the
answer ends there. Drafted tokens (speculative decoding) are cut to the prefix the grammar accepts and each
verification row gets the mask of the state after the drafts before it (`draft_masks`), the parser rolled back
after.

The grammar engine is llguidance (the optional extra `strata-moe[structured]`): Rust, no dependencies, masks in
tens of microseconds, JSON schema, Lark (and llama.cpp's GBNF, converted by its own converter) and regular
expressions, rollback. None of it is written here.
"""

from __future__ import annotations

import functools
import json
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from strata.errors import InvalidArgument, StrataError
from strata.generation.arguments import OptionRefused
from strata.sampling import MASK_BITS, TokenMask

# The options of a generation that constrain it (Session.generate and friends), at most one a call.
CONSTRAINT_OPTIONS = ("response_format", "json_schema", "grammar", "regex")
# What a grammar is written in: JSON schema, llama.cpp's GBNF, a regular expression, llguidance's Lark.
KINDS = ("json_schema", "gbnf", "regex", "lark")
EXTRA = "pip install 'strata-moe[structured]'"
# JSON as the constraint lets it be written: one line, ", " between items and ": " after keys, no other whitespace
# (a model's usual single-line JSON; free whitespace would let a weak model pad forever). A schema's own
# "x-guidance" object overrides it (llguidance's options: whitespace_flexible, item_separator, ...).
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT = {"type": "object"}  # response_format json_object
MAX_MESSAGE = 400  # characters of the grammar engine's message kept in a refusal
# The most characters a grammar may be (a JSON schema as JSON text): what the grammar engine builds in well under a
# second (64 KiB of alternatives, enum values or optional properties: 0.03-0.43 s on the CPU machine; 1 MiB of them
# ran for minutes). Far more than a schema or grammar written for a model needs.
MAX_SOURCE = 1 << 16
# The stack of the thread that builds grammars: llguidance recurses along a grammar's rules (a chain of 5,000 rules
# overflowed the main thread's 8 MiB); 256 MiB of address space, of which only what a build touches is used.
BUILD_STACK = 256 << 20
# Texts whose token ids a codec's llguidance tokenizer keeps (the forced text of a grammar: llguidance asks again as
# an answer goes through it, and again for the next answer of the same schema); each a few dozen ids
ENCODED_TEXTS = 8192

__all__ = ["CONSTRAINT_OPTIONS", "Constraint", "Grammar", "can_mask", "check_source", "compile_constraint",
           "compile_grammar", "warm"]


def can_mask(engine: Any) -> bool:
    """Whether `engine`'s sampler takes a token mask (the engine contract's `token_masks`: docs/api.md)."""
    return bool(getattr(engine, "token_masks", False))


def _library(option: str) -> Any:
    try:
        import llguidance
    except ImportError:
        raise OptionRefused(option, f"{option}: structured output needs the grammar engine llguidance, which is not "
                                    f"installed ({EXTRA})") from None
    return llguidance


# ------------------------------------------------------------------------------------------------ the tokenizer


class _Vocabulary:
    """A codec as llguidance's TokenizerWrapper reads a tokenizer: each token's bytes, EOS, the control tokens
    (special: never matched by text) and an encoder of text."""

    def __init__(self, codec: Any):
        tokens = getattr(codec, "tokens", None)
        if not tokens:
            raise InvalidArgument("structured output needs the tokenizer's vocabulary (the codec lists no tokens)")
        token_bytes = getattr(codec, "token_bytes", None) or (lambda t: codec.decode([t]).encode())
        self.tokens = [token_bytes(i) for i in range(len(tokens))]
        eos = list(codec.eos_ids)
        if not eos:
            raise InvalidArgument("structured output needs the tokenizer's EOS id")
        self.eos_token_id, self.bos_token_id = eos[0], None
        control = set(getattr(codec, "control_tokens", ()))
        self.special_token_ids = [i for i, text in enumerate(tokens) if text in control]
        # llguidance encodes the text a grammar forces (a schema's keys, each suffix of them as the answer goes
        # through it) about once a token, 13 us each over a 248,320-token vocabulary; a request that repeats a
        # schema repeats nearly all of those texts (88 % of them on the second answer of a 20-field schema)
        self._encoded = functools.lru_cache(maxsize=ENCODED_TEXTS)(lambda text: tuple(codec.encode(text)))

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError("the codec encodes text")
        return list(self._encoded(text))


_tokenizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_tokenizers_lock = threading.Lock()


def _tokenizer(codec: Any, option: str) -> Any:
    """llguidance's tokenizer of `codec`, made once per codec (about 0.6 s for 152,000 tokens) and kept with it."""
    llg = _library(option)
    with _tokenizers_lock:
        try:
            made = _tokenizers.get(codec)
        except TypeError:  # a codec that cannot be referenced weakly is made each time
            made = None
        if made is None:
            made = llg.LLTokenizer(llg.TokenizerWrapper(_Vocabulary(codec)), eos_token=list(codec.eos_ids))
            try:
                _tokenizers[codec] = made
            except TypeError:
                pass
        return made


def warm(codec: Any) -> bool:
    """Make `codec`'s llguidance tokenizer now (what the first constraint would wait for: about 0.6 s for 152,000
    tokens), where llguidance is installed; whether it was."""
    try:
        _tokenizer(codec, "warm")
    except OptionRefused:
        return False
    return True


# ------------------------------------------------------------------------------------------------ compiling


def _said(message: Any) -> str:
    """The grammar engine's message on one line, without the parser state it appends, at most MAX_MESSAGE long."""
    text = " ".join(str(message).split("<state>")[0].split())
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + " ..."


def _refused(option: str, message: Any) -> OptionRefused:
    return OptionRefused(option, f"{option}: {_said(message)}")


def _source(kind: str, value: Any, option: str) -> str:
    """llguidance's grammar of `value` written as `kind` (KINDS); OptionRefused naming `option` where it is not
    one."""
    llg = _library(option)
    if kind not in KINDS:
        raise InvalidArgument(f"a grammar is one of {', '.join(KINDS)}, got {kind!r}")
    if kind == "json_schema":
        if isinstance(value, str):
            _check_size(value, "the JSON schema", option)
            try:
                value = json.loads(value)
            except (json.JSONDecodeError, RecursionError) as error:
                raise _refused(option, f"the JSON schema is not JSON ({error})") from None
        if isinstance(value, bool):  # the schemas true (any JSON value) and false (none)
            value = {} if value else {"not": {}}
        if not isinstance(value, Mapping):
            raise _refused(option, f"a JSON schema is an object, got {type(value).__name__}")
        try:
            text = json.dumps(value)
        except (ValueError, TypeError, RecursionError) as error:
            raise _refused(option, f"the JSON schema is not JSON ({error})") from None
        _check_size(text, "the JSON schema", option)
        try:
            return llg.LLMatcher.grammar_from_json_schema(text, defaults=dict(JSON_LAYOUT))
        except (ValueError, TypeError, RecursionError) as error:
            raise _refused(option, error) from None
    if not isinstance(value, str):
        raise _refused(option, f"a {'regular expression' if kind == 'regex' else 'grammar'} is text, got "
                               f"{type(value).__name__}")
    _check_size(value, "the regular expression" if kind == "regex" else "the grammar", option)
    if kind == "regex":
        return llg.LLMatcher.grammar_from_regex(value)
    if kind == "gbnf":
        from llguidance.gbnf_to_lark import gbnf_to_lark

        try:
            value = gbnf_to_lark(value)
        except Exception as error:  # noqa: BLE001 - the converter raises bare Exceptions for a missing rule
            raise _refused(option, f"the GBNF grammar cannot be read: {error}") from None
    return llg.LLMatcher.grammar_from_lark(value)


def _check_size(text: str, what: str, option: str) -> None:
    if len(text) > MAX_SOURCE:
        raise _refused(option, f"{what} is {len(text)} characters; at most {MAX_SOURCE}")


_builder: ThreadPoolExecutor | None = None
_builder_lock = threading.Lock()


def _built(work: Callable[[], Any]) -> Any:
    """`work()` run on the grammar builder's thread (BUILD_STACK of stack), its result or its exception."""
    global _builder
    with _builder_lock:
        if _builder is None:
            previous = threading.stack_size(BUILD_STACK)
            try:
                _builder = ThreadPoolExecutor(1, thread_name_prefix="strata-grammar")
                _builder.submit(lambda: None).result()  # its thread starts now, with that stack
            finally:
                threading.stack_size(previous)
    return _builder.submit(work).result()


def _checked(grammar: str, option: str, tokenizer: Any = None) -> None:
    llg = _library(option)
    try:
        failed, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    except (ValueError, TypeError, RuntimeError) as error:
        raise _refused(option, error) from None
    if failed:
        raise _refused(option, messages[0] if messages else "the grammar is invalid")


def check_source(kind: str, value: Any, option: str) -> None:
    """Refuse (OptionRefused naming `option`) a grammar that cannot compile for any tokenizer: before a model
    loads."""
    _built(lambda: _checked(_source(kind, value, option), option))


def compile_grammar(codec: Any, kind: str, value: Any, option: str) -> Grammar:
    """`value`, a grammar written as `kind` (KINDS), compiled against `codec`'s vocabulary; OptionRefused naming
    `option` with the grammar engine's words where it cannot be (an unsupported JSON schema keyword, a regex
    look-around, a GBNF rule that is missing, a grammar over MAX_SOURCE characters, ...). Built on a thread of its
    own with a deep stack (BUILD_STACK)."""
    def build() -> Grammar:
        source = _source(kind, value, option)
        tokenizer = _tokenizer(codec, option)
        _checked(source, option, tokenizer)
        return Grammar(source, tokenizer, option)

    return _built(build)


def _response_format(value: Any, option: str) -> Any:
    """The JSON schema OpenAI's response_format asks for: None for text, any object for json_object, the schema of
    json_schema (enforced whether `strict` is true or not)."""
    if not isinstance(value, Mapping):
        raise _refused(option, "response_format is an object with a type: text, json_object or json_schema")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return ANY_OBJECT
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, Mapping):
            raise _refused(option, "response_format json_schema needs its json_schema object (name, schema, strict)")
        schema = spec.get("schema", ANY_OBJECT)
        return ANY_OBJECT if schema is None else schema
    raise _refused(option, f"response_format's type is text, json_object or json_schema, got {kind!r:.40}")


def compile_constraint(codec: Any, option: str, value: Any) -> Grammar | None:
    """The constraint a generation option asks for (CONSTRAINT_OPTIONS: OpenAI's `response_format`, a
    `json_schema` (an object or its JSON text), a `grammar` in llama.cpp's GBNF, a `regex`), compiled against
    `codec`; None where it constrains nothing (response_format text). A Grammar already compiled is taken as it is."""
    if isinstance(value, Grammar):
        vocab = len(getattr(codec, "tokens", ()) or ())
        if vocab and vocab != value.vocab:
            raise OptionRefused(option, f"{option}: the grammar was compiled for a vocabulary of {value.vocab} tokens, "
                                        f"not this model's {vocab}")
        return value
    if option == "response_format":
        schema = _response_format(value, option)
        return None if schema is None else compile_grammar(codec, "json_schema", schema, option)
    kind = {"json_schema": "json_schema", "grammar": "gbnf", "regex": "regex"}.get(option)
    if kind is None:
        raise InvalidArgument(f"the constraint options are {', '.join(CONSTRAINT_OPTIONS)}, got {option!r}")
    return compile_grammar(codec, kind, value, option)


# ------------------------------------------------------------------------------------------------ compiled, running


class Grammar:
    """A constraint compiled against one tokenizer (immutable, shared by any number of generations): `start()`
    gives one generation's state. `option` names what asked for it (a refusal or a failure names it). Its parser
    is built here, once (by compile_grammar, on its deep stack), with its first mask: a grammar that allows no
    answer at all (a schema that only refers to itself, a left-recursive rule) is refused now; each generation
    starts from a copy of that parser and mask."""

    def __init__(self, source: str, tokenizer: Any, option: str):
        self.source, self.tokenizer, self.option = source, tokenizer, option
        self.vocab = int(tokenizer.vocab_size)
        self.words = -(-self.vocab // MASK_BITS)
        llg = _library(option)
        self._parser = llg.LLMatcher(tokenizer, source, log_level=0)
        self.first = np.zeros(self.words, np.int32)
        if not self._parser.is_error():
            self._parser.unsafe_compute_mask_ptr(self.first.ctypes.data, self.first.nbytes)
        if self._parser.is_error():
            raise _refused(option, f"the grammar allows no answer ({_said(self._parser.get_error())})")

    def start(self) -> Constraint:
        return Constraint(self)


class Constraint:
    """One generation's place in its grammar: the tokens it allows next (`mask`), advanced by each token drawn
    (`advance`), and the masks of a verification's rows (`valid_prefix`, `draft_masks`)."""

    def __init__(self, grammar: Grammar):
        self.grammar = grammar
        self._matcher = grammar._parser.deep_copy()  # a copy of the built parser: nothing is built again
        self._moves = 0  # tokens consumed so far: a mask is of the state it was made in
        self._failed()

    def _failed(self) -> None:
        """A grammar the engine cannot follow further (one of llguidance's limits: a schema too ambiguous, a lexer
        too large) is the request's: OptionRefused naming its option."""
        if self._matcher.is_error():
            raise _refused(self.grammar.option, f"the grammar engine cannot go on: {self._matcher.get_error()}")

    def _fill(self, out: np.ndarray) -> None:
        self._matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)
        self._failed()

    def mask(self) -> TokenMask:
        """The tokens allowed next, computed when the engine first asks (`fill` or `words`) and only in the state it
        was made in: the constraint does not move while the engine call it goes with runs."""
        moves = self._moves
        if moves == 0:
            return TokenMask(self.grammar.first)

        def compute(out: np.ndarray) -> None:
            if self._moves != moves:
                raise StrataError(f"{self.grammar.option}: a token mask was computed after its constraint moved on")
            self._fill(out)

        return TokenMask(size=self.grammar.words, compute=compute)

    def _now(self) -> TokenMask:
        out = np.zeros(self.grammar.words, np.int32)
        self._fill(out)
        return TokenMask(out)

    def advance(self, token: int, mask: TokenMask | None = None) -> None:
        """The token drawn (never an EOS: that ends the answer) under `mask`. Where the grammar does not take it:
        StrataError if the mask did not allow it or was never computed (an engine that did not apply it), else
        OptionRefused (the grammar engine met one of its limits: the grammar's fault)."""
        if not self._matcher.consume_token(int(token)):
            said = _said(self._matcher.get_error())
            if mask is not None and mask.computed and mask.allowed(int(token) + 1)[int(token)]:
                raise _refused(self.grammar.option, f"the grammar engine cannot go on: {said}")
            raise StrataError(f"{self.grammar.option}: the engine produced token {token}, which the grammar does not "
                              f"allow there ({said})")
        self._moves += 1

    def valid_prefix(self, tokens: Sequence[int], eos: Sequence[int] = ()) -> int:
        """How many of `tokens`, from the start, the grammar accepts in turn, stopping before an EOS id (an answer
        drafted past its end is verified only up to it)."""
        stop = next((i for i, t in enumerate(tokens) if t in eos), len(tokens))
        return self._matcher.validate_tokens([int(t) for t in tokens[:stop]]) if stop else 0

    def draft_masks(self, drafts: Sequence[int]) -> list[TokenMask]:
        """The masks of a verification's k + 1 rows: row i's is the state's after drafts[:i] (`drafts` as
        valid_prefix leaves them); the state is as before afterwards."""
        if drafts and self._matcher.validate_tokens([int(t) for t in drafts]) != len(drafts):
            raise InvalidArgument("the drafts are not all ones the grammar allows in turn (cut them with valid_prefix)")
        masks = [self._now()]
        consumed = 0
        try:
            for token in drafts:
                self._matcher.consume_token(int(token))
                consumed += 1
                masks.append(self._now())
        finally:
            if consumed:
                self._matcher.rollback(consumed)
        return masks

    @property
    def accepting(self) -> bool:
        """Whether the text so far is a whole sentence of the grammar (EOS may come now)."""
        return self._matcher.is_accepting()

    @property
    def done(self) -> bool:
        """Whether only EOS may come now."""
        return self._matcher.is_stopped()
