"""A strict scanner of a GGUF file's header, metadata and tensor-info sections.

Nothing in the file is trusted: every count, string and array length is bounded by the bytes left in the
file and by caps far above any real model, before anything is allocated. Tensor data is never read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np

from strata.errors import FormatError
from strata.format.types import ACCEPTED_TYPES, FLOAT_TYPES, T, block_layout, type_name

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_KV = 1 << 20
MAX_TENSORS = 1 << 20
MAX_STRING = 16 << 20
MAX_KEY = 1 << 16
MAX_TENSOR_NAME = 63          # ggml's GGML_MAX_NAME (64) includes the terminating NUL
MAX_DIMS = 4
MAX_ALIGNMENT = 1 << 16
DEFAULT_ALIGNMENT = 32
INT64_MAX = (1 << 63) - 1
V = gguf.GGUFValueType
_SCALARS: dict[V, str] = {V.UINT8: "<B", V.INT8: "<b", V.UINT16: "<H", V.INT16: "<h", V.UINT32: "<I",
                          V.INT32: "<i", V.FLOAT32: "<f", V.BOOL: "<B", V.UINT64: "<Q", V.INT64: "<q",
                          V.FLOAT64: "<d"}
_MIN_KV_BYTES = 8 + 1 + 4 + 1          # key length, one key byte, value type, smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ne: tuple[int, ...]
    ggml_type: gguf.GGMLQuantizationType
    offset: int          # from the start of the data section
    nbytes: int


@dataclass
class ScannedFile:
    version: int
    metadata: dict[str, Any]
    value_types: dict[str, V]        # scalar type, or the element type of an array
    tensors: dict[str, TensorInfo]
    alignment: int
    data_start: int                  # absolute file offset of the data section


class _Cursor:
    def __init__(self, buf: Any, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise FormatError(f"file truncated: {what} at byte {self.pos} needs {n} bytes, "
                              f"only {self.size - self.pos} left")

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return value

    def string(self, what: str, cap: int = MAX_STRING) -> str:
        n = self.unpack("<Q", f"length of {what}")
        if n > cap:
            raise FormatError(f"{what}: string length {n} exceeds the limit of {cap} bytes")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FormatError(f"{what}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def scan(buf: Any, size: int) -> ScannedFile:
    """Scan the header, metadata and tensor infos of the GGUF bytes `buf` (size bytes); FormatError if malformed."""
    cur = _Cursor(buf, size)
    version = _header(cur)
    n_tensors = _count(cur, "tensor count", MAX_TENSORS, _MIN_TENSOR_INFO_BYTES)
    n_kv = _count(cur, "metadata key/value count", MAX_KV, _MIN_KV_BYTES)
    metadata: dict[str, Any] = {}
    value_types: dict[str, V] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}", MAX_KEY)
        if not key or key in metadata:
            raise FormatError(f"metadata key #{i} {key!r} is empty or duplicated")
        metadata[key], value_types[key] = _value(cur, key)
    alignment = _alignment(metadata, value_types)
    infos = [_tensor_info(cur, i) for i in range(n_tensors)]
    data_start = -(-cur.pos // alignment) * alignment
    if infos and data_start > size:
        raise FormatError(f"file truncated: the data section starts at byte {data_start}, the file has {size}")
    tensors: dict[str, TensorInfo] = {}
    for info in infos:
        if info.name in tensors:
            raise FormatError(f"tensor {info.name!r} appears twice in the tensor-info section")
        tensors[info.name] = info
    _check_data_layout(infos, alignment, size - data_start)
    return ScannedFile(version, metadata, value_types, tensors, alignment, data_start)


def _header(cur: _Cursor) -> int:
    cur.need(8, "GGUF header (magic and version)")
    magic = bytes(cur.buf[0:4])
    if magic != MAGIC:
        raise FormatError(f"not a GGUF file: magic is {magic!r}, expected {MAGIC!r}")
    cur.pos = 4
    version = cur.unpack("<I", "version")
    swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
    if version not in VERSIONS and swapped in (1, 2, 3):
        raise FormatError("big-endian GGUF files are not supported (strata reads little-endian GGUF only)")
    if version not in VERSIONS:
        raise FormatError(f"GGUF version {version} is not supported; expected one of {VERSIONS}")
    return version


def _count(cur: _Cursor, what: str, cap: int, min_bytes: int) -> int:
    n = cur.unpack("<Q", what)
    left = cur.size - cur.pos
    if n > cap or n * min_bytes > left:
        raise FormatError(f"{what} {n} is impossible: the limit is {cap} and the {left} bytes left "
                          f"hold at most {left // min_bytes} (file truncated, or the count is corrupt)")
    return n


def _value_type(cur: _Cursor, what: str) -> V:
    code = cur.unpack("<I", f"value type of {what}")
    try:
        return V(code)
    except ValueError:
        raise FormatError(f"{what}: unknown GGUF value type {code}") from None


def _value(cur: _Cursor, key: str) -> tuple[Any, V]:
    vtype = _value_type(cur, f"metadata key {key!r}")
    if vtype == V.ARRAY:
        etype = _value_type(cur, f"elements of array {key!r}")
        return _array(cur, key, etype), etype
    return _scalar(cur, key, vtype), vtype


def _scalar(cur: _Cursor, key: str, vtype: V) -> Any:
    if vtype == V.STRING:
        return cur.string(f"metadata value {key!r}")
    value = cur.unpack(_SCALARS[vtype], f"metadata value {key!r}")
    if vtype == V.BOOL:
        if value > 1:
            raise FormatError(f"metadata value {key!r}: a bool must be 0 or 1, found {value}")
        return bool(value)
    return value


def _array(cur: _Cursor, key: str, etype: V) -> list[Any]:
    if etype == V.ARRAY:
        raise FormatError(f"metadata value {key!r}: arrays of arrays are not supported")
    n = cur.unpack("<Q", f"length of array {key!r}")
    item = 8 if etype == V.STRING else struct.calcsize(_SCALARS[etype])   # a string is at least its length
    left = cur.size - cur.pos
    if n * item > left:
        raise FormatError(f"metadata array {key!r} claims {n} elements of at least {item} bytes, "
                          f"but only {left} bytes are left in the file")
    if etype == V.STRING:
        return [cur.string(f"element {i} of {key!r}") for i in range(n)]
    values = np.frombuffer(cur.buf, dtype=np.dtype(_SCALARS[etype]), count=n, offset=cur.pos)
    cur.pos += n * item
    if etype == V.BOOL:
        if n and int(values.max()) > 1:
            raise FormatError(f"metadata array {key!r}: bools must be 0 or 1, found {int(values.max())}")
        return [bool(v) for v in values.tolist()]
    return values.tolist()


def _alignment(metadata: dict[str, Any], value_types: dict[str, V]) -> int:
    key = gguf.Keys.General.ALIGNMENT
    if key not in metadata:
        return DEFAULT_ALIGNMENT
    value = metadata[key]
    if value_types[key] != V.UINT32:
        raise FormatError(f"metadata key {key!r}: expected a uint32, found type {value_types[key].name}")
    if value < 8 or value > MAX_ALIGNMENT or value & (value - 1):
        raise FormatError(f"metadata key {key!r}: expected a power of two in 8..{MAX_ALIGNMENT}, found {value}")
    return value


def _tensor_info(cur: _Cursor, index: int) -> TensorInfo:
    name = cur.string(f"name of tensor #{index}", MAX_TENSOR_NAME)
    if not name:
        raise FormatError(f"tensor #{index} has an empty name")
    n_dims = cur.unpack("<I", f"dimension count of tensor {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise FormatError(f"tensor {name!r}: expected 1..{MAX_DIMS} dimensions, found {n_dims}")
    ne = tuple(cur.unpack("<Q", f"dimension {d} of tensor {name!r}") for d in range(n_dims))
    code = cur.unpack("<I", f"type of tensor {name!r}")
    offset = cur.unpack("<Q", f"data offset of tensor {name!r}")
    if any(d == 0 or d > INT64_MAX for d in ne):
        raise FormatError(f"tensor {name!r}: every dimension must be in 1..2^63-1, found ne={ne}")
    count = 1
    for d in ne:
        count *= d
    if count > INT64_MAX:
        raise FormatError(f"tensor {name!r}: the element count of ne={ne} overflows 64 bits")
    ggml_type = _tensor_type(name, code, len(ne))
    block, block_bytes = block_layout(ggml_type)
    if ne[0] % block:
        raise FormatError(f"tensor {name!r}: ne0 = {ne[0]} is not a multiple of the {ggml_type.name} block "
                          f"size {block}")
    nbytes = count // block * block_bytes
    if nbytes > INT64_MAX:
        raise FormatError(f"tensor {name!r}: the byte size of ne={ne} as {ggml_type.name} overflows 64 bits")
    return TensorInfo(name, ne, ggml_type, offset, nbytes)


def _tensor_type(name: str, code: int, n_dims: int) -> gguf.GGMLQuantizationType:
    try:
        ggml_type = T(code)
    except ValueError:
        raise FormatError(f"tensor {name!r}: unknown ggml type {code}") from None
    if ggml_type not in ACCEPTED_TYPES:
        raise FormatError(f"tensor {name!r}: type {type_name(code)}: no canonical form holds it "
                          "(see docs/forms.md)")
    if n_dims < 2 and ggml_type not in FLOAT_TYPES:
        raise FormatError(f"tensor {name!r}: a 1-D tensor must be F32, F16 or BF16, found {ggml_type.name}")
    return ggml_type


def _check_data_layout(infos: list[TensorInfo], alignment: int, data_size: int) -> None:
    end_of_previous, previous = 0, None
    for info in sorted(infos, key=lambda t: t.offset):
        if info.offset % alignment:
            raise FormatError(f"tensor {info.name!r}: data offset {info.offset} is not a multiple of the "
                              f"alignment {alignment}")
        if info.offset + info.nbytes > data_size:
            raise FormatError(f"tensor {info.name!r}: data [{info.offset}, {info.offset + info.nbytes}) lies "
                              f"beyond the end of the data section ({data_size} bytes); file truncated?")
        if info.offset < end_of_previous:
            raise FormatError(f"tensor {info.name!r}: data at offset {info.offset} overlaps tensor "
                              f"{previous!r}, which ends at {end_of_previous}")
        end_of_previous, previous = info.offset + info.nbytes, info.name
