"""The tokenizer built from GGUF metadata: merges, whole special tokens, byte-exact round trips."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from support.malformed import CHAT_TEMPLATE, MERGES, Layout, build_tiny, tiny_vocab, with_kv
from strata.errors import FormatError
from strata.format import inspect
from strata.format.tokenizer_check import SPECIAL_ID_KEYS

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


def test_special_ids_by_role(tiny_file: Path) -> None:
    eos = tiny_vocab()[0].index("<|endoftext|>")
    with inspect(tiny_file) as mf:
        tok = mf.tokenizer()
    assert tok.special_ids == {"bos": [eos], "eos": [eos], "pad": [eos]}   # pad from tokenizer.ggml.padding_token_id
    assert tok.pad_id == eos


def _byte_tokens(lowercase: bool) -> dict:
    # "Ġthe" (token 266, made by the last merge) becomes the byte token of 'A'; the merge goes with it
    tokens, types, _ = tiny_vocab()
    tokens[266], types[266] = "<0x4a>" if lowercase else "<0x4A>", int(gguf.TokenType.BYTE)
    return {"tokenizer.ggml.tokens": (tokens, V.STRING), "tokenizer.ggml.token_type": (types, V.INT32),
            "tokenizer.ggml.merges": (list(MERGES[:-1]), V.STRING)}


N_VOCAB = len(tiny_vocab()[0])
# variants that real files hold and llama.cpp reads: each opens, and its tokenizer builds
ACCEPTED = {
    "scores-float32": {"tokenizer.ggml.scores": ([-float(i) for i in range(N_VOCAB)], V.FLOAT32)},
    "scores-int32": {"tokenizer.ggml.scores": (list(range(N_VOCAB)), V.INT32)},
    "every-special-id": {key: (N_VOCAB - 1 - i, V.UINT32) for i, key in enumerate(SPECIAL_ID_KEYS.values())},
    "flags": {f"tokenizer.ggml.{name}": (True, V.BOOL)
              for name in ("add_bos_token", "add_eos_token", "add_sep_token", "add_space_prefix",
                           "remove_extra_whitespaces")},
    "named-templates": {"tokenizer.chat_template.tool_use": ("{{ x }}", V.STRING),
                        "tokenizer.chat_templates": (["tool_use"], V.STRING)},
    "token-type-count": {"tokenizer.ggml.token_type_count": (1, V.UINT32)},
    "byte-token": _byte_tokens(lowercase=False),
    "byte-token-lowercase": _byte_tokens(lowercase=True),
    "no-token-types": {"tokenizer.ggml.token_type": None},
    "no-pre-tokenizer": {"tokenizer.ggml.pre": None},
    "no-special-ids": {key: None for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.bos_token_id",
                                             "tokenizer.ggml.padding_token_id")},
    "no-tokenizer-model": {"tokenizer.ggml.model": None, "tokenizer.ggml.merges": None},
    "unknown-tokenizer-key": {"tokenizer.ggml.mystery": (1.5, V.FLOAT64)},
}


@pytest.mark.parametrize("changes", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_accepted_variants(tiny_file: Path, tmp_path: Path, changes: dict) -> None:
    path = tmp_path / "variant.gguf"
    path.write_bytes(with_kv(Layout(tiny_file), changes))
    with inspect(path) as mf:
        assert mf.warnings == []
        if "tokenizer.ggml.model" in mf.metadata:
            tok = mf.tokenizer()
            assert tok.decode(tok.encode("hello world")) == "hello world"


def test_other_tokenizer_models_open_with_a_warning(tiny_file: Path, tmp_path: Path) -> None:
    path = tmp_path / "llama.gguf"
    path.write_bytes(with_kv(Layout(tiny_file), {"tokenizer.ggml.model": ("llama", V.STRING)}))
    with inspect(path) as mf:
        assert any("'tokenizer.ggml.model' is 'llama'" in w for w in mf.warnings)
        with pytest.raises(FormatError, match="'llama'"):
            mf.tokenizer()


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


@pytest.mark.parametrize("missing", ["vocab", "merges"])
def test_convert_refuses_a_bpe_tokenizer_json_without_vocab_or_merges(tmp_path: Path, missing: str) -> None:
    from strata.convert.tokenizer_meta import from_hf_dir

    model = {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}
    del model[missing]
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": model}))
    with pytest.raises(FormatError, match=f"tokenizer.json: the BPE model has no '{missing}'"):
        from_hf_dir("qwen3next", tmp_path, 3, {})
