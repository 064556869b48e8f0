"""The repack disk cache: round trip, memory mapping, staleness and corruption."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from strata.quant import QuantTensor, repack
from strata.quant import cache
from strata.quant.synthetic import random_blocks


@pytest.fixture
def source(tmp_path: Path, rng: np.random.Generator) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(rng.bytes(1000))
    return path


def make_tensors(rng: np.random.Generator) -> dict[str, QuantTensor | np.ndarray]:
    return {
        name: repack(random_blocks(t, rows * cols, rng), t, (cols, rows))
        for name, t, rows, cols in [
            ("blk.0.ffn_up.weight", T.Q4_K, 5, 512), ("blk.0.ffn_down.weight", T.Q2_K, 3, 256),
            ("blk.0.attn_q.weight", T.MXFP4, 2, 64), ("output_norm.weight", T.F32, 1, 96),
            ("token_embd.weight", T.BF16, 4, 32),
        ]
    }


def assert_same(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for name, tensor in want.items():
        loaded = got[name]
        if isinstance(tensor, np.ndarray):
            assert loaded.dtype == tensor.dtype and np.array_equal(loaded.view(np.uint8), tensor.view(np.uint8)), name
            continue
        assert loaded.form == tensor.form and (loaded.rows, loaded.cols) == (tensor.rows, tensor.cols), name
        for plane, array in tensor.planes().items():
            assert np.array_equal(loaded.planes()[plane].view(np.uint8), array.view(np.uint8)), f"{name}.{plane}"


def test_round_trip_is_memory_mapped(tmp_path: Path, source: Path, rng: np.random.Generator) -> None:
    tensors = make_tensors(rng)
    path = tmp_path / "model.strata-cache"
    cache.save(path, source, tensors)
    loaded = cache.load(path, source)
    assert loaded is not None
    assert_same(loaded, tensors)
    for plane in loaded["blk.0.ffn_up.weight"].planes().values():
        assert isinstance(plane.base, np.memmap) or isinstance(plane, np.memmap)
        assert not plane.flags.writeable and plane.ctypes.data % cache.ALIGN == 0


def test_stale_source_is_rebuilt(tmp_path: Path, source: Path, rng: np.random.Generator) -> None:
    path = tmp_path / "model.strata-cache"
    first, second = make_tensors(rng), make_tensors(rng)
    assert_same(cache.load_or_build(path, source, lambda: first), first)
    assert_same(cache.load_or_build(path, source, lambda: pytest.fail("a valid cache must not rebuild")), first)
    st = source.stat()
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # the source changed
    assert cache.load(path, source) is None
    assert_same(cache.load_or_build(path, source, lambda: second), second)


@pytest.mark.parametrize("damage", ["truncate", "grow", "magic", "header", "version"])
def test_damaged_cache_is_never_trusted(tmp_path: Path, source: Path, rng: np.random.Generator, damage: str) -> None:
    path = tmp_path / "model.strata-cache"
    tensors = make_tensors(rng)
    cache.save(path, source, tensors)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: int(rng.integers(0, len(data)))]
    elif damage == "grow":
        data += b"\0" * 64
    elif damage == "magic":
        data[0] ^= 0xFF
    elif damage == "header":
        data[20] = ord("}")
    else:
        data = data.replace(b'"version":%d' % cache.CACHE_VERSION, b'"version":%d' % (cache.CACHE_VERSION + 1))
    path.write_bytes(bytes(data))
    assert cache.load(path, source) is None
    rebuilt = cache.load_or_build(path, source, lambda: tensors)
    assert_same(rebuilt, tensors)
