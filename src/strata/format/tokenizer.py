"""The tokenizer a GGUF file carries (tokenizer.ggml.*), as a `tokenizers.Tokenizer`.

Qwen files store a byte-level BPE ("gpt2" model): tokens in the byte-to-unicode alphabet, merges as
"left right" strings, token types (3 = control, 4 = user-defined are matched whole, never split).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from strata.errors import FormatError

MODEL_KEY = "tokenizer.ggml.model"
TOKENS_KEY = "tokenizer.ggml.tokens"
TYPES_KEY = "tokenizer.ggml.token_type"
MERGES_KEY = "tokenizer.ggml.merges"
PRE_KEY = "tokenizer.ggml.pre"
TEMPLATE_KEY = "tokenizer.chat_template"
SPECIAL_KEYS = ("bos", "eos", "eot", "eom", "pad", "unknown", "sep")
CONTROL, USER_DEFINED = 3, 4
TOKEN_TYPES = range(0, 7)     # llama.cpp: undefined, normal, unknown, control, user-defined, unused, byte

# The Qwen2 pre-tokenizer split (llama.cpp LLAMA_VOCAB_PRE_TYPE_QWEN2): contractions, letters with one leading
# non-letter, single digits, punctuation runs, newlines, spaces.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3.5 / qwen4exp files ("qwen35"): the same split, with combining marks (\p{M}) kept inside words.
QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_SPLITS = {"qwen2": QWEN2_SPLIT, "qwen35": QWEN35_SPLIT, "default": QWEN2_SPLIT}


def _fail(key: str, expected: str, found: Any) -> FormatError:
    return FormatError(f"tokenizer metadata {key!r}: expected {expected}, found {found}")


def _string_list(kv: Mapping[str, Any], key: str) -> list[str]:
    value = kv[key]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(key, "an array of strings", _kind(value))
    return value


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return f"an array of {type(value[0]).__name__}" if value else "an empty array"
    return type(value).__name__


def _ids(kv: Mapping[str, Any], key: str, n_tokens: int) -> list[int]:
    value = kv[key]
    ids = value if isinstance(value, list) else [value]
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise _fail(key, "a token id or a list of token ids", _kind(value))
    bad = [i for i in ids if not 0 <= i < n_tokens]
    if bad:
        raise _fail(key, f"token ids in 0..{n_tokens - 1}", bad[0])
    return ids


def validate_tokenizer_metadata(kv: Mapping[str, Any], n_vocab: int) -> list[str]:
    """Check the tokenizer keys a file has (it may have none); returns warnings, raises FormatError."""
    if MODEL_KEY not in kv:
        return []
    warnings = []
    model = kv[MODEL_KEY]
    if model != "gpt2":
        warnings.append(f"{MODEL_KEY} is {model!r}: strata builds only the 'gpt2' (byte-level BPE) tokenizer")
    if TOKENS_KEY not in kv:
        raise FormatError(f"tokenizer metadata {TOKENS_KEY!r} is missing although {MODEL_KEY} is present")
    tokens = _string_list(kv, TOKENS_KEY)
    if len(tokens) != n_vocab:
        raise _fail(TOKENS_KEY, f"{n_vocab} tokens (the vocabulary size)", f"{len(tokens)} tokens")
    if TYPES_KEY in kv:
        types = kv[TYPES_KEY]
        if not isinstance(types, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in types):
            raise _fail(TYPES_KEY, "an array of integers", _kind(types))
        if len(types) != len(tokens):
            raise _fail(TYPES_KEY, f"{len(tokens)} entries (one per token)", f"{len(types)} entries")
        if types and (min(types) < TOKEN_TYPES.start or max(types) >= TOKEN_TYPES.stop):
            raise _fail(TYPES_KEY, "token types in 0..6", [t for t in types if t not in TOKEN_TYPES][0])
    if MERGES_KEY in kv:
        bad = [m for m in _string_list(kv, MERGES_KEY) if m.count(" ") != 1]
        if bad:
            raise _fail(MERGES_KEY, "merges of the form 'left right'", repr(bad[0]))
    for name in SPECIAL_KEYS:
        key = f"tokenizer.ggml.{name}_token_id"
        if key in kv:
            _ids(kv, key, len(tokens))
    for key in (PRE_KEY, TEMPLATE_KEY):
        if key in kv and not isinstance(kv[key], str):
            raise _fail(key, "a string", _kind(kv[key]))
    return warnings


class Tokenizer:
    """encode/decode with the file's vocabulary; special ids, EOS ids and the chat template.

    Text becomes control tokens (<|im_end|>, ...) only when asked (`special=True`, as for a rendered chat
    template); by default a control token's text in the input is plain text, so user text cannot end a turn.
    """

    def __init__(self, kv: Mapping[str, Any], n_vocab: int):
        validate_tokenizer_metadata(kv, n_vocab)
        if kv.get(MODEL_KEY) != "gpt2":
            raise FormatError(f"{MODEL_KEY} is {kv.get(MODEL_KEY)!r}; strata builds only 'gpt2' (byte-level BPE)")
        self.tokens: Sequence[str] = kv[TOKENS_KEY]
        self.special_ids = {name: _ids(kv, f"tokenizer.ggml.{name}_token_id", len(self.tokens))
                            for name in SPECIAL_KEYS if f"tokenizer.ggml.{name}_token_id" in kv}
        self.chat_template: str | None = kv.get(TEMPLATE_KEY)
        self.pre: str = kv.get(PRE_KEY, "default")
        self._hf = _build(self.tokens, kv.get(MERGES_KEY, []), kv.get(TYPES_KEY), self.pre)
        self._encoding = threading.Lock()  # the HF tokenizer's special-token switch is one flag for all callers

    @property
    def bos_id(self) -> int | None:
        return self.special_ids.get("bos", [None])[0]

    @property
    def pad_id(self) -> int | None:
        return self.special_ids.get("pad", [None])[0]

    @property
    def eos_ids(self) -> list[int]:
        """Every id that ends generation: eos (a scalar or a list) and eot, in that order, without repeats."""
        ids = self.special_ids.get("eos", []) + self.special_ids.get("eot", [])
        return list(dict.fromkeys(ids))

    def encode(self, text: str, special: bool = False) -> list[int]:
        """The ids of `text`; with `special`, control tokens written in it are read as such."""
        with self._encoding:
            self._hf.encode_special_tokens = not special
            return self._hf.encode(text, add_special_tokens=False).ids

    def count(self, text: str, special: bool = False) -> int:
        """How many tokens `text` is (as `encode`)."""
        return len(self.encode(text, special))

    def decode(self, ids: Sequence[int]) -> str:
        bad = [i for i in ids if not 0 <= i < len(self.tokens)]
        if bad:
            raise FormatError(f"decode: token id {bad[0]} is outside the vocabulary 0..{len(self.tokens) - 1}")
        return self._hf.decode(list(ids), skip_special_tokens=False)


def _build(tokens: Sequence[str], merges: Sequence[str], types: Sequence[int] | None, pre: str) -> Any:
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    if pre not in PRE_SPLITS:
        raise FormatError(f"{PRE_KEY} is {pre!r}; strata knows the pre-tokenizers {sorted(PRE_SPLITS)}")
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    pairs = [tuple(m.split(" ")) for m in merges]
    try:
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    except Exception as exc:  # tokenizers raises a bare Exception, e.g. for a merge of unknown tokens
        raise FormatError(f"{MERGES_KEY}: the BPE model cannot be built ({exc})") from None
    hf.normalizer = normalizers.NFC()
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_SPLITS[pre]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    hf.decoder = decoders.ByteLevel()
    if types is not None:
        special = [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == CONTROL]
        user = [AddedToken(tokens[i], special=False, normalized=False) for i, t in enumerate(types)
                if t == USER_DEFINED]
        hf.add_special_tokens(special)
        hf.add_tokens(user)
    return hf
