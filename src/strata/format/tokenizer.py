"""The tokenizer a GGUF file carries (tokenizer.ggml.*), as a `tokenizers.Tokenizer`.

Qwen files store a byte-level BPE ("gpt2" model): tokens in the byte-to-unicode alphabet, merges as
"left right" strings, token types (3 = control, 4 = user-defined are matched whole, never split).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from strata.errors import FormatError
from strata.format.tokenizer_check import CONTROL, USER_DEFINED, K, special_ids

# The Qwen2 pre-tokenizer split (llama.cpp LLAMA_VOCAB_PRE_TYPE_QWEN2): contractions, letters with one leading
# non-letter, single digits, punctuation runs, newlines, spaces.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3.5 / qwen4exp files ("qwen35"): the same split, with combining marks (\p{M}) kept inside words.
QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_SPLITS = {"qwen2": QWEN2_SPLIT, "qwen35": QWEN35_SPLIT, "default": QWEN2_SPLIT}


class Tokenizer:
    """encode/decode with the file's vocabulary; special ids, EOS ids and the chat template.

    Text becomes control tokens (<|im_end|>, ...) only when asked (`special=True`, as for a rendered chat
    template); by default a control token's text in the input is plain text, so user text cannot end a turn.
    """

    # decode is the UTF-8 decoding (invalid bytes replaced) of the ids' bytes laid end to end (the ByteLevel
    # decoder): a text that ends in a whole character stays as it is whatever follows (strata.generation.text)
    byte_level = True

    def __init__(self, kv: Mapping[str, Any]):
        """kv: a file's metadata as strata.format.ModelFile holds it, its tokenizer keys checked when it opened."""
        if kv.get(K.MODEL) != "gpt2":
            raise FormatError(f"{K.MODEL} is {kv.get(K.MODEL)!r}; strata builds only 'gpt2' (byte-level BPE)")
        self.tokens: Sequence[str] = kv[K.LIST]
        self.special_ids: dict[str, list[int]] = special_ids(kv)
        self.chat_template: str | None = kv.get(K.CHAT_TEMPLATE)
        self.pre: str = kv.get(K.PRE, "default")
        types = kv.get(K.TOKEN_TYPE)
        # the texts `encode(..., special=True)` reads as control tokens (a chat template's markers)
        self.control_tokens: tuple[str, ...] = tuple(self.tokens[i] for i, t in enumerate(types or ()) if t == CONTROL)
        self._hf = _build(self.tokens, kv[K.MERGES], types, self.pre)
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

    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for, whole: a piece of a UTF-8 character stays the byte it is (its decoded
        text would be U+FFFD), so two tokens never read alike. A control token is its text's UTF-8."""
        if not 0 <= token < len(self.tokens):
            raise FormatError(f"token id {token} is outside the vocabulary 0..{len(self.tokens) - 1}")
        text = self.tokens[token]
        if all(c in _BYTE_OF_CHAR for c in text):
            return bytes(_BYTE_OF_CHAR[c] for c in text)
        return text.encode()


def byte_chars() -> list[str]:
    """GPT-2's byte -> printable character map, byte order (bytes that print as themselves keep their char)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


_BYTE_OF_CHAR = {c: b for b, c in enumerate(byte_chars())}


def _build(tokens: Sequence[str], merges: Sequence[str], types: Sequence[int] | None, pre: str) -> Any:
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    if pre not in PRE_SPLITS:
        raise FormatError(f"{K.PRE} is {pre!r}; strata knows the pre-tokenizers {sorted(PRE_SPLITS)}")
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    pairs = [tuple(m.split(" ")) for m in merges]
    try:
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    except Exception as exc:  # tokenizers raises a bare Exception, e.g. for a merge of unknown tokens
        raise FormatError(f"{K.MERGES}: the BPE model cannot be built ({exc})") from None
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
