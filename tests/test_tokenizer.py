"""The tokenizer built from GGUF metadata: merges, whole special tokens, byte-exact round trips."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from malformed import CHAT_TEMPLATE, build_tiny, tiny_vocab
from strata.errors import FormatError
from strata.format import inspect

V = gguf.GGUFValueType


@pytest.fixture
def tiny_file(tmp_path: Path, rng: np.random.Generator) -> Path:
    return build_tiny(tmp_path / "tok.gguf", rng)


def test_merges_and_special_tokens(tiny_file: Path) -> None:
    tokens = tiny_vocab()[0]
    with inspect(tiny_file) as mf:
        tok = mf.tokenizer()
    ids = tok.encode("hello world<|im_end|> the", special=True)
    assert [tokens[i] for i in ids] == ["hello", "Ġworld", "<|im_end|>", "Ġthe"]
    assert tok.count("hello world<|im_end|> the", special=True) == 4
    assert tok.eos_ids == [tokens.index("<|endoftext|>")]
    assert tok.bos_id == tokens.index("<|endoftext|>")
    assert tok.chat_template == CHAT_TEMPLATE


def test_user_text_never_becomes_a_control_token_unless_asked(tiny_file: Path) -> None:
    tokens = tiny_vocab()[0]
    with inspect(tiny_file) as mf:
        tok = mf.tokenizer()
    plain = tok.encode("hi<|im_end|>")
    assert tokens.index("<|im_end|>") not in plain and tok.decode(plain) == "hi<|im_end|>"
    assert tok.count("hi<|im_end|>") == len(plain) > tok.count("hi<|im_end|>", special=True)


def test_round_trip_is_byte_exact(tiny_file: Path, rng: np.random.Generator) -> None:
    # code points from ASCII, Latin-1, CJK, emoji and whitespace: every byte-level path
    pool = [chr(c) for c in [*range(32, 127), *range(0xA0, 0x180), *range(0x4E00, 0x4E40), *range(0x1F600, 0x1F620)]]
    pool += ["\n", "\t", "  ", "\r\n", "<|im_start|>"]
    with inspect(tiny_file) as mf:
        tok = mf.tokenizer()
    for _ in range(50):
        text = "".join(rng.choice(pool, size=int(rng.integers(1, 40))))
        ids = tok.encode(text)
        assert all(0 <= i < len(tiny_vocab()[0]) for i in ids)
        assert tok.decode(ids) == text, f"round trip failed for {text!r} (seed in the test log)"


def test_eos_may_be_a_list(tmp_path: Path, rng: np.random.Generator) -> None:
    tokens = tiny_vocab()[0]
    eos = [tokens.index("<|im_end|>"), tokens.index("<|endoftext|>")]
    path = build_tiny(tmp_path / "eos.gguf", rng, kv={"tokenizer.ggml.eos_token_id": (eos, V.UINT32)})
    with inspect(path) as mf:
        assert mf.tokenizer().eos_ids == eos


def test_decode_refuses_ids_outside_the_vocabulary(tiny_file: Path) -> None:
    with inspect(tiny_file) as mf:
        tok = mf.tokenizer()
    with pytest.raises(FormatError, match="outside the vocabulary"):
        tok.decode([1, len(tiny_vocab()[0])])


def test_unknown_pre_tokenizer_is_refused_when_building(tmp_path: Path, rng: np.random.Generator) -> None:
    path = build_tiny(tmp_path / "pre.gguf", rng, kv={"tokenizer.ggml.pre": ("mystery", V.STRING)})
    with inspect(path) as mf:
        with pytest.raises(FormatError, match="'mystery'"):
            mf.tokenizer()


def test_qwen35_split_keeps_combining_marks_inside_words() -> None:
    from tokenizers import Regex
    from tokenizers.pre_tokenizers import Split

    from strata.format.tokenizer import PRE_SPLITS

    def pieces(name: str, text: str) -> list[str]:
        split = Split(Regex(PRE_SPLITS[name]), behavior="isolated")
        return [piece for piece, _ in split.pre_tokenize_str(text)]

    text = "cafe\u0301 don't 42"
    assert pieces("qwen35", text) == ["cafe\u0301", " don", "'t", " ", "4", "2"]
    assert pieces("qwen2", text) == ["cafe", "\u0301", " don", "'t", " ", "4", "2"]
