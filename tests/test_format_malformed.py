"""The malformed corpus: every case must raise strata.FormatError naming the problem, quickly.

Byte-level cases corrupt one structure of a valid tiny file (tests/malformed.py); model-level cases are
written whole with a fault injected (missing tensor, bad key, bad tokenizer array, ...).
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest

from malformed import Layout, build_tiny, patched
from strata.errors import FormatError
from strata.format import inspect

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
    ("type-without-form", lambda L: patched(L.blob, L.tensor_type_at(EXPERTS), "<I", int(T.IQ2_XXS)),
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


def _expect_format_error(path: Path, fragment: str) -> None:
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(FormatError) as info:
            inspect(path)
    finally:
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
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
    ("tokens-wrong-length", dict(kv={"tokenizer.ggml.tokens": (["a", "b"], V.STRING),
                                     "qwen4exp.vocab_size": (270, V.UINT32)}), "270 tokens"),
    ("tokens-wrong-type", dict(kv={"tokenizer.ggml.tokens": (list(range(270)), V.INT32)}), "array of strings"),
    ("token-type-wrong-type", dict(kv={"tokenizer.ggml.token_type": ([1.0] * 270, V.FLOAT32)}), "array of integers"),
    ("token-type-wrong-length", dict(kv={"tokenizer.ggml.token_type": ([1] * 20, V.INT32)}), "270 entries"),
    ("merges-wrong-type", dict(kv={"tokenizer.ggml.merges": ([1, 2], V.INT32)}), "array of strings"),
    ("eos-out-of-range", dict(kv={"tokenizer.ggml.eos_token_id": (270, V.UINT32)}), "token ids in 0..269"),
    ("bos-out-of-range", dict(kv={"tokenizer.ggml.bos_token_id": (1 << 31, V.UINT32)}), "token ids in 0..269"),
    ("template-not-string", dict(kv={"tokenizer.chat_template": (5, V.UINT32)}), "a string"),
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
