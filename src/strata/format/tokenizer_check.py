"""Checks a file's tokenizer metadata (tokenizer.ggml.*, tokenizer.chat_template*): types, lengths, ids, bytes.

Each key must have the GGUF type llama.cpp's converter (gguf-py's GGUFWriter) writes for it; variants that
llama.cpp reads as well are accepted, and noted where they appear in `KEY_TYPES`. Keys this table does not
know are left alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gguf

from strata.errors import FormatError

V = gguf.GGUFValueType
K = gguf.Keys.Tokenizer
CLS_ID = "tokenizer.ggml.cls_token_id"       # written by older gguf-py (BERT files), read by nothing today
NAMED_TEMPLATE_PREFIX = K.CHAT_TEMPLATE + "."  # tokenizer.chat_template.{name}
BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
CONTROL, USER_DEFINED, BYTE = gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED, gguf.TokenType.BYTE
TOKEN_TYPES = range(0, 7)     # llama.cpp: undefined, normal, unknown, control, user-defined, unused, byte

# role -> key of every special-token id llama.cpp reads (prefix/suffix/middle: the deprecated FIM names)
SPECIAL_ID_KEYS = {
    "bos": K.BOS_ID, "eos": K.EOS_ID, "eot": K.EOT_ID, "eom": K.EOM_ID, "unknown": K.UNK_ID, "sep": K.SEP_ID,
    "pad": K.PAD_ID, "mask": K.MASK_ID, "cls": CLS_ID, "fim_pre": K.FIM_PRE_ID, "fim_suf": K.FIM_SUF_ID,
    "fim_mid": K.FIM_MID_ID, "fim_pad": K.FIM_PAD_ID, "fim_rep": K.FIM_REP_ID, "fim_sep": K.FIM_SEP_ID,
    "prefix": K.PREFIX_ID, "suffix": K.SUFFIX_ID, "middle": K.MIDDLE_ID,
}


def _a(type_name: str) -> str:
    return f"{'an' if type_name[0] in 'AEIO' else 'a'} {type_name}"    # an INT32, a UINT32


@dataclass(frozen=True)
class ValueTypes:
    """The GGUF types a key may hold: as a scalar, and as the element type of an array."""

    scalar: tuple[V, ...] = ()
    array: tuple[V, ...] = ()

    def allows(self, is_array: bool, vtype: V) -> bool:
        return vtype in (self.array if is_array else self.scalar)

    def __str__(self) -> str:
        kinds = [_a('/'.join(t.name for t in self.scalar))] if self.scalar else []
        kinds += [f"an array of {'/'.join(t.name for t in self.array)}"] if self.array else []
        return " or ".join(kinds)


STRING, FLAG, TOKEN_ID = ValueTypes(scalar=(V.STRING,)), ValueTypes(scalar=(V.BOOL,)), ValueTypes(scalar=(V.UINT32,))
STRINGS = ValueTypes(array=(V.STRING,))
KEY_TYPES: dict[str, ValueTypes] = {
    K.MODEL: STRING, K.PRE: STRING, K.LIST: STRINGS, K.MERGES: STRINGS,
    K.TOKEN_TYPE: ValueTypes(array=(V.INT32,)),
    K.SCORES: ValueTypes(array=(V.FLOAT32, V.INT32)),        # llama.cpp reads integer scores too
    K.TOKEN_TYPE_COUNT: ValueTypes(scalar=(V.UINT32,)),
    **{key: TOKEN_ID for key in SPECIAL_ID_KEYS.values()},
    # strata's one extension: several ids that end generation (llama.cpp reads a single one)
    K.EOS_ID: ValueTypes(scalar=(V.UINT32,), array=(V.UINT32,)),
    K.ADD_BOS: FLAG, K.ADD_EOS: FLAG, K.ADD_SEP: FLAG, K.ADD_PREFIX: FLAG, K.REMOVE_EXTRA_WS: FLAG,
    K.PRECOMPILED_CHARSMAP: ValueTypes(array=(V.UINT8, V.INT8)),   # bytes; llama.cpp takes either sign
    K.HF_JSON: STRING, K.RWKV: STRING, K.CHAT_TEMPLATE: STRING, K.CHAT_TEMPLATES: STRINGS,
}
PER_TOKEN_KEYS = (K.TOKEN_TYPE, K.SCORES)     # one entry per token of K.LIST
NEEDS_TOKENS = (K.MODEL, *PER_TOKEN_KEYS, K.MERGES)


def fail(key: str, expected: str, found: Any) -> FormatError:
    return FormatError(f"tokenizer metadata {key!r}: expected {expected}, found {found}")


def _types_of(key: str) -> ValueTypes | None:
    return STRING if key.startswith(NAMED_TEMPLATE_PREFIX) else KEY_TYPES.get(key)


def _kind(value: Any, vtype: V) -> str:
    return f"an array of {vtype.name}" if isinstance(value, list) else _a(vtype.name)


def _check_types(kv: Mapping[str, Any], value_types: Mapping[str, V]) -> None:
    for key, value in kv.items():
        allowed = _types_of(key)
        if allowed is not None and not allowed.allows(isinstance(value, list), value_types[key]):
            raise fail(key, str(allowed), _kind(value, value_types[key]))


def _check_tokens(kv: Mapping[str, Any], n_vocab: int) -> None:
    tokens = kv[K.LIST]
    if len(tokens) != n_vocab:
        raise fail(K.LIST, f"{n_vocab} tokens (the vocabulary size)", f"{len(tokens)} tokens")
    for key in PER_TOKEN_KEYS:
        if key in kv and len(kv[key]) != len(tokens):
            raise fail(key, f"{len(tokens)} entries, one per token of {K.LIST!r}", f"{len(kv[key])} entries")
    types = kv.get(K.TOKEN_TYPE, [])
    if types and (min(types) < TOKEN_TYPES.start or max(types) >= TOKEN_TYPES.stop):
        index = next(i for i, t in enumerate(types) if t not in TOKEN_TYPES)
        raise fail(K.TOKEN_TYPE, f"token types in 0..{TOKEN_TYPES.stop - 1}", f"{types[index]} at token {index}")
    for index in (i for i, t in enumerate(types) if t == BYTE):
        if not BYTE_TOKEN.fullmatch(tokens[index]):
            raise fail(K.LIST, f"a byte token '<0xXX>' at token {index} (its {K.TOKEN_TYPE!r} is BYTE)",
                       repr(tokens[index][:64]))


def _check_merges(merges: Sequence[str]) -> None:
    for index, merge in enumerate(merges):
        left, _, right = merge.partition(" ")
        if not left or not right or " " in right:
            raise fail(K.MERGES, f"merges of the form 'left right' (merge {index})", repr(merge[:64]))


def _check_ids(kv: Mapping[str, Any], n_vocab: int) -> None:
    for key in SPECIAL_ID_KEYS.values():
        if key not in kv:
            continue
        ids = kv[key] if isinstance(kv[key], list) else [kv[key]]
        if not ids:
            raise fail(key, "a token id or a non-empty list of them", "an empty array")
        bad = next((i for i in ids if not 0 <= i < n_vocab), None)
        if bad is not None:
            raise fail(key, f"a token id inside the vocabulary of {n_vocab} tokens (0..{n_vocab - 1})", bad)


def check_tokenizer_keys(kv: Mapping[str, Any], value_types: Mapping[str, V]) -> None:
    """The checks that need no vocabulary size: each key's type, and the token list wherever its companions are.
    Run before the architecture is read, whose vocabulary size is the token list's length unless
    `{arch}.vocab_size` says otherwise (llama.cpp's converter writes none), so a bad list is named as such.

    kv and value_types as the scanner reads them: an array's value is a list, its type its element type.
    """
    _check_types(kv, value_types)
    present = [key for key in NEEDS_TOKENS if key in kv]
    if present and K.LIST not in kv:
        raise FormatError(f"tokenizer metadata {K.LIST!r} is missing although {present[0]!r} is present")


def check_tokenizer_metadata(kv: Mapping[str, Any], n_vocab: int) -> list[str]:
    """The rest, after check_tokenizer_keys: lengths, token types, byte tokens, merges and special ids against
    the vocabulary of `n_vocab` tokens; returns warnings, raises FormatError."""
    warnings = []
    if K.MODEL in kv:
        model = kv[K.MODEL]
        if model != "gpt2":
            warnings.append(f"{K.MODEL!r} is {model!r}: strata builds only the 'gpt2' (byte-level BPE) tokenizer")
        if model == "gpt2" and K.MERGES not in kv:
            raise FormatError(f"tokenizer metadata {K.MERGES!r} is missing although {K.MODEL!r} is 'gpt2' "
                              "(a BPE tokenizer needs its merges)")
    if K.LIST in kv:
        _check_tokens(kv, n_vocab)
    if K.MERGES in kv:
        _check_merges(kv[K.MERGES])
    _check_ids(kv, n_vocab)
    return warnings


def special_ids(kv: Mapping[str, Any]) -> dict[str, list[int]]:
    """role (bos, eos, eot, pad, ...) -> its ids, for the special-token keys present (checked metadata)."""
    return {role: kv[key] if isinstance(kv[key], list) else [kv[key]]
            for role, key in SPECIAL_ID_KEYS.items() if key in kv}
