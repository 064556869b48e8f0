"""Write a GGUF file whose tensor data arrives later, piece by piece, possibly from several threads.

The header, metadata and tensor infos are written first (by gguf.GGUFWriter, so the layout is exactly
gguf-py's); every tensor's absolute file offset is then known, and data is placed with positioned writes.
Nothing is buffered: a 100 GB model streams through a few chunks of memory.
"""

from __future__ import annotations

import glob
import os
import stat
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from strata.convert.output_path import EndingSignals, check_target
from strata.errors import InvalidArgument

Progress = Callable[[int, int], None]


def tensor_nbytes(ne: Sequence[int], ggml_type: gguf.GGMLQuantizationType) -> int:
    """Bytes of a tensor of shape `ne` (ggml order) and type; InvalidArgument if ne0 does not fill blocks."""
    block, size = gguf.GGML_QUANT_SIZES[ggml_type]
    if ne[0] % block:
        raise InvalidArgument(f"{ggml_type.name} needs ne0 % {block} == 0, got ne {tuple(ne)}")
    return int(np.prod(ne, dtype=np.int64)) // block * size


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    ne: tuple[int, ...]
    ggml_type: gguf.GGMLQuantizationType
    nbytes: int
    offset: int          # absolute position in the file


def _add_metadata(writer: gguf.GGUFWriter, kv: Iterable[tuple[str, Any, gguf.GGUFValueType]]) -> None:
    for key, value, vtype in kv:
        if key == gguf.Keys.General.ARCHITECTURE:
            continue  # GGUFWriter writes it from its arch argument
        if isinstance(value, (list, tuple)):
            # metadata_for's convention: for an array the type given is its element type
            writer.add_key_value(key, list(value), gguf.GGUFValueType.ARRAY, sub_type=vtype)
        else:
            writer.add_key_value(key, value, vtype)


PARTIAL = ".partial-"  # NAME.partial-PID: the file being written for NAME by process PID


def remove_stale_partials(final: Path) -> None:
    """Remove the partial files beside `final` left by writes to its name whose process is gone: one ended by
    SIGKILL (or a power cut) could not remove its own. A partial file of a process still running is its write in
    progress, and stays (a process of another PID namespace writing the same folder would look gone: not done)."""
    for partial in final.parent.glob(glob.escape(final.name + PARTIAL) + "*"):
        pid = partial.name.rsplit("-", 1)[1]
        try:
            if pid.isdigit() and stat.S_ISREG(partial.lstat().st_mode) and not _running(int(pid)):
                partial.unlink()
        except FileNotFoundError:  # another write's cleanup took it first
            pass


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: running
        pass
    return True


class GGUFStream:
    """An open GGUF file with its layout fixed; fill tensors with `write` (thread-safe), then leave the `with`
    block. The file is written under a temporary name beside `path` and renamed to it only when complete, so an
    interrupted write (an exception, Ctrl-C, SIGTERM, SIGHUP) never leaves a half-written model at `path`, nor
    the temporary file. `path` must be free, or a regular file and `overwrite` (strata.convert.output_path)."""

    def __init__(self, path: str | Path, arch: str, kv: Iterable[tuple[str, Any, gguf.GGUFValueType]],
                 tensors: Sequence[tuple[str, Sequence[int], gguf.GGMLQuantizationType]],
                 progress: Progress | None = None, overwrite: bool = False):
        self.final, self.overwrite = Path(path), overwrite
        check_target(self.final, overwrite)
        remove_stale_partials(self.final)
        self.path = self.final.with_name(f"{self.final.name}{PARTIAL}{os.getpid()}")
        self._fd = -1
        self._signals = EndingSignals()
        try:
            self._lay_out(arch, kv, tensors)
        except BaseException as error:
            self.close()
            self.path.unlink(missing_ok=True)
            self._signals.release(error)
            raise
        self._progress = progress
        self._done = 0
        self._lock = threading.Lock()

    def _lay_out(self, arch: str, kv: Iterable[tuple[str, Any, gguf.GGUFValueType]],
                 tensors: Sequence[tuple[str, Sequence[int], gguf.GGMLQuantizationType]]) -> None:
        """Header, metadata and tensor table written; the data section allocated (zeros) and opened."""
        writer = gguf.GGUFWriter(self.path, arch)
        _add_metadata(writer, kv)
        sizes = []
        for name, ne, ggml_type in tensors:
            nbytes = tensor_nbytes(ne, ggml_type)
            sizes.append(nbytes)
            # element shape in numpy order; with a non-uint8 dtype GGUFWriter keeps it as given
            writer.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), nbytes, raw_dtype=ggml_type)
        writer.write_header_to_file(self.path)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        header_end = writer.fout[0].tell()
        writer.close()
        align = writer.data_alignment
        offset = gguf.GGUFWriter.ggml_pad(header_end, align)
        self.tensors: dict[str, PlannedTensor] = {}
        for (name, ne, ggml_type), nbytes in zip(tensors, sizes):
            self.tensors[name] = PlannedTensor(name, tuple(int(d) for d in ne), ggml_type, nbytes, offset)
            offset += gguf.GGUFWriter.ggml_pad(nbytes, align)
        self.total_bytes = offset
        self._fd = os.open(self.path, os.O_RDWR)
        os.ftruncate(self._fd, self.total_bytes)  # zero padding everywhere, data filled in below

    def write(self, name: str, at: int, data: bytes | memoryview | np.ndarray) -> None:
        """Place `data` at byte `at` inside tensor `name` (bounds-checked)."""
        t = self.tensors[name]
        buf = memoryview(np.ascontiguousarray(data)).cast("B") if isinstance(data, np.ndarray) else memoryview(data)
        if at < 0 or at + buf.nbytes > t.nbytes:
            raise InvalidArgument(f"tensor {name!r}: write of {buf.nbytes} bytes at {at} exceeds its {t.nbytes} bytes")
        pos = t.offset + at
        while buf.nbytes:
            n = os.pwrite(self._fd, buf, pos)
            buf, pos = buf[n:], pos + n
            with self._lock:
                self._done += n
                if self._progress is not None:
                    self._progress(self._done, self.total_bytes)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "GGUFStream":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()
        try:
            if exc_type is None:
                check_target(self.final, self.overwrite)  # the name may have been taken while writing
                os.replace(self.path, self.final)
        finally:
            self.path.unlink(missing_ok=True)  # never leave a half-written model behind
            self._signals.release(exc)
