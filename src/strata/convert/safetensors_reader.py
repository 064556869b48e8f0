"""Read a transformers checkpoint's *.safetensors files without torch.

A safetensors file is an 8-byte little-endian header length, a JSON header mapping each tensor name to
its dtype, shape and byte range, then the data. Files are memory-mapped: reading one tensor touches only
its own pages, so a converter can stream a checkpoint far larger than RAM.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from strata.errors import FormatError

# The JSON header is small in practice (a few MB for thousands of tensors); this bound only rejects garbage.
_MAX_HEADER_BYTES = 256 * 1024 * 1024

_NUMPY_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor lives: file, safetensors dtype name, shape (row-major) and absolute byte range."""
    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_header(path: Path) -> dict[str, StoredTensor]:
    """Parse one .safetensors header; FormatError naming the file on anything malformed."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise FormatError(f"{path.name}: truncated safetensors file ({size} bytes, expected an 8-byte header length)")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER_BYTES or 8 + n > size:
            raise FormatError(f"{path.name}: safetensors header length {n} exceeds the file size {size}")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise FormatError(f"{path.name}: safetensors header is not valid JSON ({e})") from e
    data_start = 8 + n
    tensors: dict[str, StoredTensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info.get("dtype")
        if dtype not in _NUMPY_DTYPES:
            raise FormatError(f"{path.name}: tensor {name!r} has unsupported dtype {dtype!r}")
        shape = tuple(int(d) for d in info["shape"])
        begin, end = (int(o) for o in info["data_offsets"])
        expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(_NUMPY_DTYPES[dtype]).itemsize
        if end - begin != expected or data_start + end > size:
            raise FormatError(
                f"{path.name}: tensor {name!r} {dtype}{list(shape)} spans bytes [{begin}, {end}) "
                f"(expected {expected} bytes inside a {size}-byte file)")
        tensors[name] = StoredTensor(path, dtype, shape, data_start + begin, data_start + end)
    return tensors


class Checkpoint:
    """All tensors of a checkpoint directory (one file, or shards listed by an index json)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        files = self._shard_files()
        self._tensors: dict[str, StoredTensor] = {}
        for f in files:
            for name, t in read_header(f).items():
                if name in self._tensors:
                    raise FormatError(f"tensor {name!r} appears in both {self._tensors[name].file.name} and {f.name}")
                self._tensors[name] = t
        self._maps: dict[Path, np.memmap] = {}

    def _shard_files(self) -> list[Path]:
        index = self.directory / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text()).get("weight_map", {})
            files = sorted({self.directory / f for f in weight_map.values()})
        else:
            files = sorted(self.directory.glob("*.safetensors"))
        if not files:
            raise FormatError(f"{self.directory}: no *.safetensors files (nor model.safetensors.index.json)")
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise FormatError(f"{index.name} lists shards that do not exist: {missing}")
        return files

    def names(self) -> list[str]:
        return list(self._tensors)

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def info(self, name: str) -> StoredTensor:
        try:
            return self._tensors[name]
        except KeyError:
            raise FormatError(f"checkpoint tensor {name!r} is missing from {self.directory}") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return self.info(name).shape

    def raw(self, name: str) -> np.ndarray:
        """The stored values, memory-mapped, in their own dtype (bf16 as uint16 bit patterns)."""
        t = self.info(name)
        m = self._maps.get(t.file)
        if m is None:
            m = self._maps[t.file] = np.memmap(t.file, dtype=np.uint8, mode="r")
        return m[t.begin:t.end].view(_NUMPY_DTYPES[t.dtype]).reshape(t.shape)

    def read_f32(self, name: str, index: int | None = None) -> np.ndarray:
        """A float tensor (or its sub-tensor `index` along dim 0) widened to float32; a fresh array.

        bf16 widens by a 16-bit shift, which is exact.
        """
        t = self.info(name)
        raw = self.raw(name) if index is None else self.raw(name)[index]
        if t.dtype == "BF16":
            return (raw.astype(np.uint32) << 16).view(np.float32)
        if t.dtype not in ("F32", "F16", "F64"):
            raise FormatError(f"checkpoint tensor {name!r} has dtype {t.dtype}, expected a float type")
        return raw.astype(np.float32)

    def read_int(self, name: str) -> np.ndarray:
        """An integer tensor (e.g. the int64 PLE hash constants), exactly, as int64."""
        t = self.info(name)
        if t.dtype not in ("I64", "I32", "I16", "I8", "U8"):
            raise FormatError(f"checkpoint tensor {name!r} has dtype {t.dtype}, expected an integer type")
        return self.raw(name).astype(np.int64)

    def close(self) -> None:
        self._maps.clear()
