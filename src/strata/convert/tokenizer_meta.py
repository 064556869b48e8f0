"""The gpt2/BPE `tokenizer.ggml.*` metadata llama.cpp's converter writes for Qwen models.

`from_hf_dir` reads tokenizer.json / tokenizer_config.json; `byte_level` builds a small valid vocabulary
for checkpoints without a tokenizer (tiny test models) and for synthetic models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf

from strata.chat_templates import CHATML_TEMPLATE
from strata.errors import FormatError, InvalidArgument
from strata.format.tokenizer import byte_chars

KV = list[tuple[str, Any, gguf.GGUFValueType]]
T = gguf.GGUFValueType
K = gguf.Keys.Tokenizer
# llama.cpp's pre-tokenizer names for these families (chosen there by hashing the pre-tokenizer's output)
PRE_TOKENIZER = {"qwen3next": "qwen2", "qwen35moe": "qwen35", "qwen4exp": "qwen35"}
EOS_TEXT = "<|endoftext|>"
TURN_START, TURN_END = "<|im_start|>", "<|im_end|>"


def _kv(pre: str, tokens: list[str], types: list[int], merges: list[str], special: dict[str, int],
        chat_template: str | None) -> KV:
    kv: KV = [
        (K.MODEL, "gpt2", T.STRING), (K.PRE, pre, T.STRING),
        (K.LIST, tokens, T.STRING), (K.TOKEN_TYPE, types, T.INT32), (K.MERGES, merges, T.STRING),
    ]
    keys = {"bos": K.BOS_ID, "eos": K.EOS_ID, "eot": K.EOT_ID, "pad": K.PAD_ID, "unk": K.UNK_ID}
    kv += [(keys[role], int(tid), T.UINT32) for role, tid in special.items()]
    kv.append((K.ADD_BOS, False, T.BOOL))
    if chat_template:
        kv.append((K.CHAT_TEMPLATE, chat_template, T.STRING))
    return kv


def _grow_from(tokens: list[str | None]):
    """Yield the non-control tokens in id order, including those appended while iterating."""
    i = 0
    while True:
        t = tokens[i]
        if t is not None and t not in (EOS_TEXT, TURN_START, TURN_END):
            yield t
        i += 1


def byte_level(n_vocab: int, eos_id: int | None = None, chat: bool = False) -> KV:
    """A valid BPE vocabulary of exactly n_vocab tokens: 256 bytes, pair merges, `<|endoftext|>` as EOS. With
    `chat`, also ChatML's turn tokens (`<|im_end|>` the end of a turn, tokenizer.ggml.eot_token_id) and
    template, so the vocabulary runs chats."""
    if n_vocab < 258 + 2 * chat:
        raise InvalidArgument(f"a byte-level vocabulary needs n_vocab >= {258 + 2 * chat}, got {n_vocab}")
    eos = n_vocab - 1 if eos_id is None else eos_id
    if not 0 <= eos < n_vocab:
        raise InvalidArgument(f"eos id {eos} is outside the vocabulary of {n_vocab}")
    types = [int(gguf.TokenType.NORMAL)] * n_vocab
    tokens: list[str | None] = [*byte_chars(), *([None] * (n_vocab - 256))]
    special = {"bos": eos, "eos": eos}
    if eos >= 256:  # below 256 the id is a byte token and stays one
        tokens[eos] = EOS_TEXT
        types[eos] = int(gguf.TokenType.CONTROL)
    if chat:
        free = [i for i in range(n_vocab - 1, 255, -1) if tokens[i] is None][:2]
        for i, text in zip(sorted(free), (TURN_START, TURN_END)):
            tokens[i], types[i] = text, int(gguf.TokenType.CONTROL)
        special["eot"] = sorted(free)[1]
    # Grow tokens breadth-first, each an existing token plus one byte: all distinct, every merge valid.
    chars = byte_chars()
    grown = ((left, c) for left in _grow_from(tokens) for c in chars)
    merges: list[str] = []
    for i in range(256, n_vocab):
        if tokens[i] is None:
            left, c = next(grown)
            tokens[i] = left + c
            merges.append(f"{left} {c}")
    # a made-up vocabulary has no pre-tokenizer of its own; qwen2's splitting is the common Qwen one
    return _kv("qwen2", tokens, types, merges, special, CHATML_TEMPLATE if chat else None)


def _special_id(value: Any, by_text: dict[str, int]) -> int | None:
    if isinstance(value, dict):
        value = value.get("content")
    return by_text.get(value) if isinstance(value, str) else None


def from_hf_dir(arch: str, hf_dir: Path, n_vocab: int, config: dict[str, Any]) -> KV | None:
    """The tokenizer metadata of a checkpoint directory, or None if it has no tokenizer.json."""
    path = hf_dir / "tokenizer.json"
    if not path.exists():
        return None
    tok = json.loads(path.read_text())
    model = tok.get("model") or {}
    if model.get("type") != "BPE":
        raise FormatError(f"tokenizer.json: model type {model.get('type')!r}, expected 'BPE'")
    # A byte-level BPE needs both; llama.cpp refuses a gpt2 file without merges (as strata's reader does).
    for field in ("vocab", "merges"):
        if not model.get(field):
            raise FormatError(f"tokenizer.json: the BPE model has no {field!r}; a byte-level BPE needs its vocab "
                              "and merges")
    by_id: dict[int, tuple[str, int]] = {int(i): (t, int(gguf.TokenType.NORMAL)) for t, i in model["vocab"].items()}
    for added in tok.get("added_tokens", []):
        kind = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
        by_id[int(added["id"])] = (added["content"], int(kind))
    size = max(n_vocab, max(by_id) + 1)
    tokens, types = [], []
    for i in range(size):
        text, kind = by_id.get(i, (f"[PAD{i}]", int(gguf.TokenType.UNUSED)))
        tokens.append(text)
        types.append(kind)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    cfg_path = hf_dir / "tokenizer_config.json"
    tcfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    by_text = {t: i for i, (t, _) in by_id.items()}
    special: dict[str, int] = {}
    for role in ("bos", "eos", "pad", "unk"):
        tid = _special_id(tcfg.get(f"{role}_token"), by_text)
        if tid is None and role in ("bos", "eos"):
            fallback = config.get(f"{role}_token_id")
            tid = fallback[0] if isinstance(fallback, list) else fallback
        if tid is not None:
            special[role] = tid
    template = tcfg.get("chat_template")
    jinja = hf_dir / "chat_template.jinja"
    if template is None and jinja.exists():
        template = jinja.read_text()
    return _kv(PRE_TOKENIZER[arch], tokens, types, merges, special, template if isinstance(template, str) else None)
