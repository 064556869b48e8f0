"""llama.cpp's control-vector GGUF files (docs/control_vectors.md): read as its loader reads them
(common.cpp's common_control_vector_load_one), summed over files with their scales as
common_control_vector_load does, checked against the model, and written as its cvector-generator writes them."""

from __future__ import annotations

import operator
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from strata.errors import FormatError, InvalidArgument
from strata.format.scanner import scan

ARCHITECTURE = "controlvector"
HINT_KEY = f"{ARCHITECTURE}.model_hint"
LAYER_COUNT_KEY = f"{ARCHITECTURE}.layer_count"
_DIRECTION = re.compile(r"direction\.([0-9]+)")


@dataclass(frozen=True)
class ControlVectorFile:
    """One file's directions as written: `directions[N]` is tensor `direction.N` (n_embd float32), which llama.cpp
    adds to the output of model layer N. `model_hint` and `layer_count` are what the file says (None: absent)."""

    path: str
    model_hint: str | None
    layer_count: int | None
    directions: dict[int, np.ndarray]

    @property
    def n_embd(self) -> int:
        return len(next(iter(self.directions.values())))


def read_control_vector(path: str | os.PathLike[str]) -> ControlVectorFile:
    """The directions of the control-vector file at `path`. Refused (FormatError naming the file and the tensor):
    another architecture, no direction tensor, a tensor not named direction.N with N >= 1 (llama.cpp has no
    vector for layer 0), one not float32 or not 1-D, directions of different lengths, a NaN or infinite value."""
    name = os.fspath(path)
    data = Path(name).read_bytes()
    try:
        scanned = scan(data, len(data))
    except FormatError as error:
        raise FormatError(f"control vector {name}: {error}") from None
    arch = scanned.metadata.get("general.architecture")
    if arch != ARCHITECTURE:
        raise FormatError(f"control vector {name}: general.architecture is {arch!r}, not {ARCHITECTURE!r} "
                          "(a control-vector file, as llama.cpp's cvector-generator writes)")
    if not scanned.tensors:
        raise FormatError(f"control vector {name}: no direction tensors (direction.N, N >= 1)")
    directions: dict[int, np.ndarray] = {}
    for info in scanned.tensors.values():
        match = _DIRECTION.fullmatch(info.name)
        if match is None or int(match[1]) == 0:
            raise FormatError(f"control vector {name}: tensor {info.name!r} is not a direction.N with N >= 1 "
                              "(N: the model layer whose output it steers; layer 0 has none)")
        if info.ggml_type != gguf.GGMLQuantizationType.F32 or len(info.ne) != 1:
            raise FormatError(f"control vector {name}: tensor {info.name} must be 1-D float32, got "
                              f"{info.ggml_type.name} of shape {list(info.ne)}")
        start = scanned.data_start + info.offset
        vector = np.frombuffer(data, dtype="<f4", count=info.ne[0], offset=start).astype(np.float32)
        if not np.all(np.isfinite(vector)):  # it would make every hidden state it touches NaN, token after token
            bad = int(np.flatnonzero(~np.isfinite(vector))[0])
            raise FormatError(f"control vector {name}: tensor {info.name} holds {vector[bad]} at index {bad}; "
                              "a direction must be finite")
        if directions and len(vector) != len(next(iter(directions.values()))):
            raise FormatError(f"control vector {name}: tensor {info.name} has {len(vector)} values, the file's "
                              f"other directions {len(next(iter(directions.values())))}")
        directions[int(match[1])] = vector
    return ControlVectorFile(name, _text(scanned.metadata, HINT_KEY), _count(scanned.metadata, name),
                             directions)


def _text(metadata: Mapping[str, Any], key: str) -> str | None:
    value = metadata.get(key)
    return value if isinstance(value, str) else None


def _count(metadata: Mapping[str, Any], name: str) -> int | None:
    value = metadata.get(LAYER_COUNT_KEY)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise FormatError(f"control vector {name}: {LAYER_COUNT_KEY} must be an integer, got {value!r}")
    return value


def steering_table(vectors: Sequence[tuple[str | os.PathLike[str], float]], geometry: Any,
                   layers: tuple[int, int] | None = None) -> dict[int, np.ndarray]:
    """The vector added to each steered layer's output, {layer: float32 [n_embd]}, from `vectors` (path, scale)
    pairs: every file's direction.N times its scale, summed in float32 in the order given (as llama.cpp's
    common_control_vector_load), kept only on the layers of `layers` (start, end inclusive; None: all).
    Refused, naming the file, tensor, layer and limit: a width other than the model's n_embd, a direction.N for
    a layer the model lacks (N > n_layer - 1; llama.cpp drops those silently), a scale that makes a layer's
    vector overflow float32. A `controlvector.model_hint` other
    than the model's architecture is only warned about (llama.cpp's loader does not read it)."""
    n_embd, n_layer = geometry.n_embd, geometry.n_layer
    start, end = layer_range(layers, n_layer)
    table: dict[int, np.ndarray] = {}
    for pair in vectors:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise InvalidArgument(f"control_vectors takes (path, scale) pairs, got {pair!r:.80}")
        path, scale = pair
        file = read_control_vector(path)
        if file.n_embd != n_embd:
            raise InvalidArgument(f"control vector {file.path}: direction.{min(file.directions)} has "
                                  f"{file.n_embd} values, the model's n_embd is {n_embd}")
        if max(file.directions) > n_layer - 1:
            raise InvalidArgument(f"control vector {file.path}: direction.{max(file.directions)} steers layer "
                                  f"{max(file.directions)}, the model's last layer is {n_layer - 1}")
        if file.model_hint is not None and file.model_hint != geometry.arch:
            warnings.warn(f"control vector {file.path} was made for {file.model_hint!r}, this model is "
                          f"{geometry.arch!r}", stacklevel=2)
        scale = _scale(scale, file.path)
        with np.errstate(over="ignore"):  # an overflow is refused below, by name
            weight = np.float32(scale)
            for layer, direction in file.directions.items():
                if start <= layer <= end:
                    before = table.get(layer)
                    table[layer] = (np.zeros(n_embd, np.float32) if before is None else before) + direction * weight
                    if not np.all(np.isfinite(table[layer])):  # every token would come out NaN
                        raise InvalidArgument(f"control vector {file.path}: direction.{layer} times {scale:g}"
                                              f"{'' if before is None else ' plus the vectors before it'} is not "
                                              "finite in float32; give a smaller scale")
    return table


def _scale(scale: Any, path: str) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)) \
            or not np.isfinite(scale):
        raise InvalidArgument(f"control vector {path}: the scale must be a finite number, got {scale!r}")
    return float(scale)


def layer_range(layers: tuple[int, int] | None, n_layer: int) -> tuple[int, int]:
    """(start, end), inclusive, of the layers a control vector steers: `layers`, or every layer (llama.cpp's
    default, 1..n_layer, when --control-vector-layer-range is not given)."""
    if layers is None:
        return 1, n_layer
    wrong = InvalidArgument(f"control_layers must be (start, end), two layer numbers, got {layers!r:.80}")
    if not isinstance(layers, (tuple, list)) or len(layers) != 2 or any(isinstance(v, bool) for v in layers):
        raise wrong
    try:
        start, end = operator.index(layers[0]), operator.index(layers[1])
    except TypeError:
        raise wrong from None
    if not 0 <= start <= end:
        raise InvalidArgument(f"control_layers ({start}, {end}): need 0 <= start <= end")
    if start > n_layer - 1:
        raise InvalidArgument(f"control_layers ({start}, {end}): start is past the model's last layer "
                              f"{n_layer - 1}")
    return start, end


def write_control_vector(path: str | os.PathLike[str], directions: Mapping[int, np.ndarray],
                         model_hint: str) -> None:
    """Write `directions` ({N: float32 [n_embd]}, N >= 1) as llama.cpp's cvector-generator does (export_gguf):
    general.architecture controlvector, controlvector.model_hint, controlvector.layer_count (int32: the number of
    directions), one 1-D float32 tensor direction.N each, in layer order."""
    if not directions or min(directions) < 1:
        raise InvalidArgument("a control vector needs directions for layers >= 1 (llama.cpp steers no layer 0)")
    writer = gguf.GGUFWriter(os.fspath(path), ARCHITECTURE)
    try:
        writer.add_string(HINT_KEY, model_hint)
        writer.add_int32(LAYER_COUNT_KEY, len(directions))
        for layer in sorted(directions):
            writer.add_tensor(f"direction.{layer}", np.ascontiguousarray(directions[layer], dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
