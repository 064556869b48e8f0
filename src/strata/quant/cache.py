"""A disk cache of repacked tensors: one file, loaded back memory-mapped (no copy).

Container layout (all integers little-endian)::

    bytes 0..7     magic b"STRATAQC"
    bytes 8..15    u64 length H of the JSON header
    bytes 16..16+H JSON header (UTF-8)
    ...            raw planes, each starting at a 64-byte aligned file offset

The header holds ``version`` (CACHE_VERSION), ``source`` (the source file's size and mtime_ns),
``file_size`` (of the cache file itself) and ``tensors``: name -> {"form", "rows", "cols", "planes":
{plane name -> {"dtype", "shape", "offset"}}}; a float tensor has the single plane "data".
A cache whose magic, version, source key, size or plane table does not check out is stale: ``load``
returns None and ``load_or_build`` rebuilds it. Plane bytes themselves are not checksummed (that would
cost a pass over every byte at each load); the size check catches truncation.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from strata.errors import FormatError
from strata.quant.forms import FLOAT_DTYPES, form_named
from strata.quant.tensor import QuantTensor

CACHE_VERSION = 1  # bump whenever a form's planes or this container change
MAGIC = b"STRATAQC"
ALIGN = 64
_PREFIX = struct.Struct("<8sQ")
Tensors = Mapping[str, "QuantTensor | np.ndarray"]

log = logging.getLogger(__name__)


class _Stale(Exception):
    """The cache file cannot be trusted; the message says why."""


def source_key(source_path: str | os.PathLike[str]) -> dict[str, int]:
    """What ties a cache to its source file: size and modification time (ns)."""
    st = os.stat(source_path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _planes_of(tensor: QuantTensor | np.ndarray) -> tuple[str, dict[str, np.ndarray], int, int]:
    if isinstance(tensor, QuantTensor):
        return tensor.form.name, tensor.planes(), tensor.rows, tensor.cols
    kind = next((k for k, dtype in FLOAT_DTYPES.items() if tensor.dtype == dtype and tensor.ndim == 2), None)
    if kind is None:
        raise FormatError(f"cache: a float tensor must be 2-D float32/float16/uint16(bf16); found {tensor.dtype}{list(tensor.shape)}")
    return kind, {"data": tensor}, tensor.shape[0], tensor.shape[1]


def save(cache_path: str | os.PathLike[str], source_path: str | os.PathLike[str], tensors: Tensors) -> None:
    """Write ``tensors`` to ``cache_path`` atomically (a temporary file renamed over it)."""
    entries: dict[str, Any] = {}
    layout: list[tuple[dict[str, Any], int, np.ndarray]] = []  # (plane's header entry, offset past the header, plane)
    relative = 0
    for name, tensor in tensors.items():
        form, planes, rows, cols = _planes_of(tensor)
        table = {}
        for plane_name, plane in planes.items():
            table[plane_name] = {"dtype": plane.dtype.str, "shape": list(plane.shape), "offset": 0}
            layout.append((table[plane_name], relative, plane))
            relative = _align(relative + plane.nbytes)
        entries[name] = {"form": form, "rows": rows, "cols": cols, "planes": table}
    header = {"version": CACHE_VERSION, "source": source_key(source_path), "file_size": 0, "tensors": entries}
    # Offsets and the file size in the header depend on the header's own length: grow the room reserved
    # for it until the encoded header fits.
    room = ALIGN
    while True:
        data_start = _align(_PREFIX.size + room)
        for entry, offset, _ in layout:
            entry["offset"] = data_start + offset
        header["file_size"] = data_start + relative
        encoded = json.dumps(header, separators=(",", ":")).encode()
        if len(encoded) <= room:
            break
        room = len(encoded) + ALIGN
    cache_path = Path(cache_path)
    tmp = cache_path.with_name(f".{cache_path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(_PREFIX.pack(MAGIC, len(encoded)))
            f.write(encoded)
            for entry, _, plane in layout:
                f.seek(entry["offset"])
                f.write(np.ascontiguousarray(plane).data)
            f.truncate(header["file_size"])
        os.replace(tmp, cache_path)
    finally:
        tmp.unlink(missing_ok=True)


def load(cache_path: str | os.PathLike[str], source_path: str | os.PathLike[str]) -> dict[str, QuantTensor | np.ndarray] | None:
    """The tensors of a valid cache for ``source_path``, memory-mapped read-only; None if missing or stale."""
    try:
        return _read(Path(cache_path), source_key(source_path))
    except FileNotFoundError:
        return None
    except _Stale as why:
        log.info("cache %s is stale: %s", cache_path, why)
        return None


def load_or_build(cache_path: str | os.PathLike[str], source_path: str | os.PathLike[str],
                  build: Callable[[], Tensors]) -> dict[str, QuantTensor | np.ndarray]:
    """The cached tensors, or ``build()`` written to the cache (replacing a stale one) and loaded back."""
    tensors = load(cache_path, source_path)
    if tensors is None:
        save(cache_path, source_path, build())
        tensors = load(cache_path, source_path)
        if tensors is None:
            raise FormatError(f"cache {cache_path}: just written, yet it does not read back (source changed meanwhile?)")
    return tensors


def _read(path: Path, key: dict[str, int]) -> dict[str, QuantTensor | np.ndarray]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(_PREFIX.size)
        if len(prefix) < _PREFIX.size:
            raise _Stale(f"{size} bytes, shorter than the {_PREFIX.size}-byte prefix")
        magic, header_len = _PREFIX.unpack(prefix)
        if magic != MAGIC:
            raise _Stale(f"magic {magic!r}, expected {MAGIC!r}")
        if header_len > size - _PREFIX.size:
            raise _Stale(f"header of {header_len} bytes does not fit in a {size}-byte file")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _Stale(f"header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise _Stale("header is not a JSON object")
    for field, expected in (("version", CACHE_VERSION), ("source", key), ("file_size", size)):
        if header.get(field) != expected:
            raise _Stale(f"{field} is {header.get(field)!r}, expected {expected!r}")
    data = np.memmap(path, dtype=np.uint8, mode="r")
    try:
        return {name: _tensor(name, entry, data) for name, entry in header["tensors"].items()}
    except (KeyError, TypeError, ValueError, FormatError) as e:
        raise _Stale(f"bad tensor table: {e!r}") from None


def _tensor(name: str, entry: dict[str, Any], data: np.ndarray) -> QuantTensor | np.ndarray:
    planes = {}
    for plane_name, plane in entry["planes"].items():
        dtype, shape, start = np.dtype(plane["dtype"]), tuple(int(n) for n in plane["shape"]), int(plane["offset"])
        nbytes = dtype.itemsize * int(np.prod(shape))
        if start % ALIGN or start + nbytes > data.size:
            raise ValueError(f"{name}.{plane_name}: {nbytes} bytes at offset {start} of a {data.size}-byte file")
        planes[plane_name] = data[start:start + nbytes].view(dtype).reshape(shape)
    form = entry["form"]
    if form in FLOAT_DTYPES:
        array = planes["data"]
        if array.dtype != FLOAT_DTYPES[form] or array.shape != (entry["rows"], entry["cols"]):
            raise ValueError(f"{name}: float plane {array.dtype}{list(array.shape)} is not {form} [{entry['rows']}, {entry['cols']}]")
        return array
    return QuantTensor(form_named(form), int(entry["rows"]), int(entry["cols"]), **planes)
