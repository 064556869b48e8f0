"""The malformed corpus: every case must raise strata.FormatError naming the problem, quickly.

Byte-level cases corrupt one structure of a valid tiny file (tests/support/malformed.py); model-level cases are
written whole with a fault injected (missing tensor, bad key, ...); tokenizer cases rewrite the valid file's
tokenizer metadata, one fault each, and the error must name the key, what was expected and what was found.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest

from support.malformed import Layout, build_tiny, patched, tiny_vocab, with_kv
from strata.errors import FormatError
from strata.format import inspect
from strata.format.tokenizer_check import SPECIAL_ID_KEYS

V = gguf.GGUFValueType
T = gguf.GGMLQuantizationType
EXPERTS = "blk.0.ffn_gate_exps.weight"        # Q8_0, ne (64, 32, 4)
EMBD = "token_embd.weight"                    # F16, ne (64, 270)
Corrupt = Callable[[Layout], bytes]


def _same_length_keys(layout: Layout) -> tuple[str, str]:
    keys = sorted(layout.kv_start, key=len)
    return next((a, b) for a, b in zip(keys, keys[1:]) if len(a) == len(b))


def _same_length_tensors(layout: Layout) -> tuple[str, str]:
    names = sorted(layout.tensor_start, key=len)
    return next((a, b) for a, b in zip(names, names[1:]) if len(a) == len(b))


def _rename_key(layout: Layout) -> bytes:
    a, b = _same_length_keys(layout)
    at = layout.kv_start[b] + 8
    return layout.blob[:at] + a.encode() + layout.blob[at + len(a):]


def _rename_tensor(layout: Layout) -> bytes:
    a, b = _same_length_tensors(layout)
    at = layout.tensor_start[b] + 8
    return layout.blob[:at] + a.encode() + layout.blob[at + len(a):]


def _second_tensor(layout: Layout, first: str) -> str:
    return next(n for n in layout.tensor_start if n != first)


# (case id, corruption, fragment of the expected message)
BYTE_CASES: list[tuple[str, Corrupt, str]] = [
    ("empty", lambda L: b"", "shorter than a GGUF header"),
    ("header-only-magic", lambda L: L.blob[:6], "shorter than a GGUF header"),
    ("truncated-in-counts", lambda L: L.blob[:30], "truncated"),
    ("truncated-in-kv", lambda L: L.blob[:L.kv_value_at("qwen4exp.block_count") + 2], "truncated"),
    ("truncated-in-key-string", lambda L: L.blob[:L.kv_start["tokenizer.ggml.tokens"] + 12], "truncated"),
    ("truncated-in-token-array", lambda L: L.blob[:L.kv_value_at("tokenizer.ggml.tokens") + 500], "truncated"),
    ("truncated-in-tensor-info", lambda L: L.blob[:L.tensor_type_at(EXPERTS) + 2], "truncated"),
    ("truncated-before-data", lambda L: L.blob[:L.data_start - 4], "truncated"),
    ("truncated-in-data", lambda L: L.blob[:-100], "beyond the end of the data section"),
    ("bad-magic", lambda L: b"GGML" + L.blob[4:], "not a GGUF file"),
    ("version-1", lambda L: patched(L.blob, 4, "<I", 1), "version 1 is not supported"),
    ("version-4", lambda L: patched(L.blob, 4, "<I", 4), "version 4 is not supported"),
    ("big-endian", lambda L: patched(L.blob, 4, ">I", 3), "big-endian"),
    ("tensor-count-bomb", lambda L: patched(L.blob, 8, "<Q", 1 << 40), "tensor count"),
    ("kv-count-bomb", lambda L: patched(L.blob, 16, "<Q", 5_000_000), "key/value count"),
    ("kv-count-beyond-file", lambda L: patched(L.blob, 16, "<Q", 200_000), "bytes left"),
    ("key-length-bomb", lambda L: patched(L.blob, L.kv_start["qwen4exp.block_count"], "<Q", 1 << 62),
     "exceeds the limit"),
    ("string-value-beyond-file", lambda L: patched(L.blob, L.kv_value_at("tokenizer.chat_template"), "<Q",
                                                   len(L.blob)), "truncated"),
    ("huge-string-claimed", lambda L: patched(L.blob, L.kv_value_at("tokenizer.ggml.model"), "<Q", 1 << 40),
     "exceeds the limit"),
    ("array-length-bomb", lambda L: patched(L.blob, L.kv_value_at("tokenizer.ggml.token_type") + 4, "<Q", 1 << 40),
     "claims 1099511627776 elements"),
    ("unknown-value-type", lambda L: patched(L.blob, L.kv_type_at("qwen4exp.block_count"), "<I", 99),
     "unknown GGUF value type 99"),
    ("array-of-arrays", lambda L: patched(L.blob, L.kv_value_at("tokenizer.ggml.token_type"), "<I", 9),
     "arrays of arrays"),
    ("bool-not-0-or-1", lambda L: patched(L.blob, L.kv_value_at("tokenizer.ggml.add_bos_token"), "<B", 7),
     "must be 0 or 1"),
    ("invalid-utf8-key", lambda L: patched(L.blob, L.kv_start["qwen4exp.block_count"] + 8, "<B", 0xFF),
     "not valid UTF-8"),
    ("duplicate-key", _rename_key, "duplicated"),
    ("duplicate-tensor", _rename_tensor, "appears twice"),
    ("alignment-not-power-of-two", lambda L: patched(L.blob, L.kv_value_at("general.alignment"), "<I", 48),
     "power of two"),
    ("alignment-huge", lambda L: patched(L.blob, L.kv_value_at("general.alignment"), "<I", 1 << 30),
     "power of two"),
    ("alignment-wrong-type", lambda L: patched(L.blob, L.kv_type_at("general.alignment"), "<I", 5),
     "expected a uint32"),
    ("tensor-name-bomb", lambda L: patched(L.blob, L.tensor_start[EXPERTS], "<Q", 1 << 50), "exceeds the limit"),
    ("zero-dims", lambda L: patched(L.blob, L.tensor_ndims_at(EXPERTS), "<I", 0), "1..4 dimensions"),
    ("five-dims", lambda L: patched(L.blob, L.tensor_ndims_at(EXPERTS), "<I", 5), "1..4 dimensions"),
    ("zero-dim", lambda L: patched(L.blob, L.tensor_dims_at(EXPERTS) + 8, "<Q", 0), "every dimension"),
    ("negative-dim", lambda L: patched(L.blob, L.tensor_dims_at(EXPERTS) + 8, "<q", -3), "every dimension"),
    ("element-count-overflow", lambda L: patched(patched(L.blob, L.tensor_dims_at(EMBD), "<Q", 1 << 32),
                                                 L.tensor_dims_at(EMBD) + 8, "<Q", 1 << 32), "overflows 64 bits"),
    ("byte-size-overflow", lambda L: patched(patched(L.blob, L.tensor_dims_at(EMBD), "<Q", 1 << 31),
                                             L.tensor_dims_at(EMBD) + 8, "<Q", 1 << 31), "byte size"),
    ("rows-not-multiple-of-block", lambda L: patched(L.blob, L.tensor_dims_at(EXPERTS), "<Q", 48),
     "not a multiple of the Q8_0 block size 32"),
    ("unknown-tensor-type", lambda L: patched(L.blob, L.tensor_type_at(EXPERTS), "<I", 200), "unknown ggml type 200"),
    ("type-without-form", lambda L: patched(L.blob, L.tensor_type_at(EXPERTS), "<I", int(T.Q8_K)),
     "no canonical form holds it"),
    ("offset-misaligned", lambda L: patched(L.blob, L.tensor_offset_at(EXPERTS), "<Q", L.tensor_offset(EXPERTS) + 1),
     "not a multiple of the alignment"),
    ("offset-out-of-range", lambda L: patched(L.blob, L.tensor_offset_at(EXPERTS), "<Q", 1 << 60),
     "beyond the end"),
    ("offset-overflow", lambda L: patched(L.blob, L.tensor_offset_at(EXPERTS), "<Q", (1 << 64) - 32),
     "beyond the end"),
    ("overlap", lambda L: patched(L.blob, L.tensor_offset_at(EXPERTS), "<Q",
                                  L.tensor_offset(_second_tensor(L, EXPERTS))), "overlaps"),
]


@pytest.fixture(scope="module")
def base_layout(tmp_path_factory: pytest.TempPathFactory) -> Layout:
    seed = int(np.random.SeedSequence().entropy % (2**32))
    print(f"base file seed={seed}")
    return Layout(build_tiny(tmp_path_factory.mktemp("base") / "base.gguf", np.random.default_rng(seed)))


def _expect_format_error(path: Path, *fragments: str) -> None:
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(FormatError) as info:
            inspect(path)
    finally:
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    for fragment in fragments:
        assert fragment in str(info.value), f"expected {fragment!r} in: {info.value}"
    assert elapsed < 2.0, f"took {elapsed:.2f} s"
    assert peak < 64 << 20, f"peak Python allocation {peak} bytes"   # bombs must not allocate what they claim


@pytest.mark.parametrize("corrupt, fragment", [c[1:] for c in BYTE_CASES], ids=[c[0] for c in BYTE_CASES])
def test_byte_level_corruption(base_layout: Layout, tmp_path: Path, corrupt: Corrupt, fragment: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(corrupt(base_layout))
    _expect_format_error(path, fragment)


# (case id, build_tiny keyword arguments, fragment)
MODEL_CASES: list[tuple[str, dict, str]] = [
    ("missing-tensor", dict(drop=("blk.2.ssm_a",)), "'blk.2.ssm_a'"),
    ("missing-ple-table", dict(drop=("per_layer_token_embd.weight",)), "per_layer_token_embd.weight"),
    ("extra-tensor", dict(extra={"blk.0.mystery.weight": (64, 64)}), "'blk.0.mystery.weight'"),
    ("misshapen-tensor", dict(shapes={"blk.3.attn_k.weight": (64, 32)}), "expected ne (64, 64)"),
    ("forced-f32-as-f16", dict(types={"blk.0.ssm_conv1d.weight": T.F16}), "expected F32"),
    ("ple-table-too-small", dict(shapes={"per_layer_token_embd.weight": (16, 128)}), "at least 168 rows"),
    ("quantized-1d", dict(shapes={"blk.0.ssm_norm.weight": (32,)}, types={"blk.0.ssm_norm.weight": T.Q8_0}),
     "1-D tensor must be"),
    ("missing-key", dict(kv_drop=("qwen4exp.ssm.group_count",)), "'qwen4exp.ssm.group_count' is required"),
    ("heads-not-divisible", dict(kv={"qwen4exp.attention.head_count_kv": (3, V.UINT32)}), "a divisor of"),
    ("rope-dim-too-big", dict(kv={"qwen4exp.rope.dimension_count": (64, V.UINT32)}), "<= attention.key_length"),
    ("experts-used-too-many", dict(kv={"qwen4exp.expert_used_count": (9, V.UINT32)}), "<= expert_count"),
    ("recurrent-list-short", dict(kv={"qwen4exp.attention.recurrent_layers": ([True] * 3, V.BOOL)}), "4 bools"),
    ("ple-layer-not-recurrent", dict(kv={"qwen4exp.ple.layers": ([3], V.INT32)}), "GDN layer"),
    ("ple-sizes-wrong-length", dict(kv={"qwen4exp.ple.head_vocab_sizes": ([37, 41], V.UINT64)}), "4 integers"),
    ("architecture-unknown", dict(kv={"general.architecture": ("llama", V.STRING)}), "one of"),
]


@pytest.mark.parametrize("kwargs, fragment", [c[1:] for c in MODEL_CASES], ids=[c[0] for c in MODEL_CASES])
def test_model_level_fault(tmp_path: Path, rng: np.random.Generator, kwargs: dict, fragment: str) -> None:
    if "general.architecture" in kwargs.get("kv", {}):
        # GGUFWriter writes general.architecture itself; patch the stored string in place instead
        path = build_tiny(tmp_path / "bad.gguf", rng)
        blob = path.read_bytes().replace(b"qwen4exp", b"llama\0\0\0", 1)
        path.write_bytes(blob)
    else:
        path = build_tiny(tmp_path / "bad.gguf", rng, **kwargs)
    _expect_format_error(path, fragment)


TOKENS, TYPES, MERGES = "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"
SCORES, EOS = "tokenizer.ggml.scores", "tokenizer.ggml.eos_token_id"
N_VOCAB = len(tiny_vocab()[0])
Changes = dict[str, tuple[object, V] | None]


def _typed_as_byte(index: int, text: str) -> Changes:
    """Token `index` given `text` and the BYTE type."""
    tokens, types, _ = tiny_vocab()
    tokens[index], types[index] = text, int(gguf.TokenType.BYTE)
    return {TOKENS: (tokens, V.STRING), TYPES: (types, V.INT32)}


# (key, value, its GGUF type (an array's element type), the type expected, the type found)
RETYPED: list[tuple[str, object, V, str, str]] = [
    (TOKENS, list(range(N_VOCAB)), V.INT32, "an array of STRING", "an array of INT32"),
    (TOKENS, "hello", V.STRING, "an array of STRING", "a STRING"),
    (TYPES, [1.0] * N_VOCAB, V.FLOAT32, "an array of INT32", "an array of FLOAT32"),
    (TYPES, [1] * N_VOCAB, V.UINT32, "an array of INT32", "an array of UINT32"),
    (TYPES, [1] * N_VOCAB, V.INT8, "an array of INT32", "an array of INT8"),
    (SCORES, [0.0] * N_VOCAB, V.FLOAT64, "an array of FLOAT32/INT32", "an array of FLOAT64"),
    (SCORES, ["0"] * N_VOCAB, V.STRING, "an array of FLOAT32/INT32", "an array of STRING"),
    (MERGES, [1, 2], V.INT32, "an array of STRING", "an array of INT32"),
    (MERGES, "h e", V.STRING, "an array of STRING", "a STRING"),
    ("tokenizer.ggml.model", 2, V.UINT32, "a STRING", "a UINT32"),
    ("tokenizer.ggml.pre", ["qwen2"], V.STRING, "a STRING", "an array of STRING"),
    (EOS, 1, V.INT32, "a UINT32 or an array of UINT32", "an INT32"),
    (EOS, [1, 2], V.INT64, "a UINT32 or an array of UINT32", "an array of INT64"),
    ("tokenizer.ggml.bos_token_id", 1, V.UINT64, "a UINT32", "a UINT64"),
    ("tokenizer.ggml.bos_token_id", [1], V.UINT32, "a UINT32", "an array of UINT32"),
    ("tokenizer.ggml.padding_token_id", 1.0, V.FLOAT32, "a UINT32", "a FLOAT32"),
    ("tokenizer.ggml.eot_token_id", "269", V.STRING, "a UINT32", "a STRING"),
    ("tokenizer.ggml.fim_pre_token_id", 1, V.INT16, "a UINT32", "an INT16"),
    ("tokenizer.ggml.add_bos_token", 1, V.UINT8, "a BOOL", "a UINT8"),
    ("tokenizer.ggml.add_eos_token", "false", V.STRING, "a BOOL", "a STRING"),
    ("tokenizer.ggml.token_type_count", 2, V.INT32, "a UINT32", "an INT32"),
    ("tokenizer.chat_template", 5, V.UINT32, "a STRING", "a UINT32"),
    ("tokenizer.chat_template.tool_use", True, V.BOOL, "a STRING", "a BOOL"),
    ("tokenizer.chat_templates", [1], V.UINT8, "an array of STRING", "an array of UINT8"),
]
# (case id, metadata changes, fragments the message must hold: the key, what was expected, what was found)
TOKENIZER_CASES: list[tuple[str, Changes, tuple[str, ...]]] = [
    (f"{key.removeprefix('tokenizer.')}-as-{found.replace(' ', '-')}", {key: (value, vtype)},
     (key, f"expected {expected}, found {found}"))
    for key, value, vtype, expected, found in RETYPED
] + [
    # byte tokens
    ("byte-token-plain-text", _typed_as_byte(256, "he"), (TOKENS, "'<0xXX>' at token 256", "BYTE", "'he'")),
    ("byte-token-one-digit", _typed_as_byte(266, "<0x4>"), (TOKENS, "at token 266", "'<0x4>'")),
    ("byte-token-three-digits", _typed_as_byte(266, "<0x041>"), (TOKENS, "at token 266", "'<0x041>'")),
    ("byte-token-not-hex", _typed_as_byte(0, "<0xZZ>"), (TOKENS, "at token 0", "'<0xZZ>'")),
    ("byte-token-empty", _typed_as_byte(5, ""), (TOKENS, "at token 5", "found ''")),
    # lengths and values
    # the vocabulary size is the token list's length unless the file states it (llama.cpp's converter does not)
    ("tokens-short", {TOKENS: (["a", "b"], V.STRING), "qwen4exp.vocab_size": (N_VOCAB, V.UINT32)},
     (TOKENS, f"{N_VOCAB} tokens (the vocabulary size)", "2 tokens")),
    ("token-type-short", {TYPES: ([1] * 20, V.INT32)}, (TYPES, f"{N_VOCAB} entries, one per token of", TOKENS, "20")),
    ("token-type-long", {TYPES: ([1] * (N_VOCAB + 1), V.INT32)}, (TYPES, TOKENS, f"found {N_VOCAB + 1} entries")),
    ("scores-short", {SCORES: ([0.0] * (N_VOCAB - 1), V.FLOAT32)}, (SCORES, TOKENS, f"found {N_VOCAB - 1} entries")),
    ("token-type-7", {TYPES: ([1] * (N_VOCAB - 1) + [7], V.INT32)}, (TYPES, "0..6", f"7 at token {N_VOCAB - 1}")),
    ("token-type-negative", {TYPES: ([-1] + [1] * (N_VOCAB - 1), V.INT32)}, (TYPES, "0..6", "-1 at token 0")),
    ("merge-without-space", {MERGES: (["h e", "he"], V.STRING)}, (MERGES, "'left right' (merge 1)", "'he'")),
    ("merge-two-spaces", {MERGES: (["h  e"], V.STRING)}, (MERGES, "(merge 0)", "'h  e'")),
    ("merge-empty-left", {MERGES: ([" e"], V.STRING)}, (MERGES, "(merge 0)", "' e'")),
    ("eos-empty-list", {EOS: ([], V.UINT32)}, (EOS, "non-empty list", "an empty array")),
    ("eos-list-one-outside", {EOS: ([269, 270], V.UINT32)}, (EOS, f"vocabulary of {N_VOCAB} tokens", "found 270")),
    ("bos-max-uint32", {"tokenizer.ggml.bos_token_id": ((1 << 32) - 1, V.UINT32)},
     ("tokenizer.ggml.bos_token_id", f"vocabulary of {N_VOCAB} tokens", f"found {(1 << 32) - 1}")),
    # keys that need others
    ("merges-missing", {MERGES: None}, (MERGES, "is missing", "'gpt2'")),
    ("tokens-missing", {TOKENS: None}, (TOKENS, "is missing", "tokenizer.ggml.model")),
    ("token-type-without-tokens", {TOKENS: None, "tokenizer.ggml.model": None}, (TOKENS, "is missing", TYPES)),
]
# every special-token id the reader knows, one past the vocabulary
TOKENIZER_CASES += [(f"{role}-id-outside", {key: (N_VOCAB, V.UINT32)},
                     (key, f"vocabulary of {N_VOCAB} tokens", f"found {N_VOCAB}"))
                    for role, key in SPECIAL_ID_KEYS.items()]


@pytest.mark.parametrize("changes, fragments", [c[1:] for c in TOKENIZER_CASES], ids=[c[0] for c in TOKENIZER_CASES])
def test_tokenizer_fault(base_layout: Layout, tmp_path: Path, changes: Changes, fragments: tuple[str, ...]) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(with_kv(base_layout, changes))
    _expect_format_error(path, *(repr(f) if f.startswith("tokenizer.") else f for f in fragments))
