"""The general.* keys llama.cpp's converter derives from a checkpoint directory: general.type, and the name, size
label and authorship keys that gguf-py's Metadata reads from the model card (README.md front matter), config.json,
generation_config.json (sampling defaults) and the directory name. The same gguf-py code makes them here, so the keys
and values are the converter's."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import yaml  # gguf-py's model card parser (a dependency of the gguf package)

from strata.convert.gguf_stream import tensor_nbytes
from strata.errors import FormatError

KV = list[tuple[str, Any, gguf.GGUFValueType]]


def _parameter_count(arch: str, tensors: Sequence[tuple[str, Sequence[int], gguf.GGMLQuantizationType]]):
    """(total, shared, expert, expert count) as gguf-py counts them for the size label."""
    scratch = gguf.GGUFWriter(None, arch)
    for name, ne, ggml_type in tensors:
        scratch.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), tensor_nbytes(ne, ggml_type),
                                raw_dtype=ggml_type)
    return scratch.get_total_parameter_count()


def general_metadata(hf_dir: Path, arch: str,
                     tensors: Sequence[tuple[str, Sequence[int], gguf.GGMLQuantizationType]]) -> KV:
    """The converter's general.type / name / size_label / card keys for a file of `tensors` (name, ne, type)."""
    total, shared, expert, n_expert = _parameter_count(arch, tensors)
    try:
        meta = gguf.Metadata.load(None, hf_dir, None, total)
    except (yaml.YAMLError, UnicodeDecodeError, ValueError, TypeError, AttributeError) as e:
        raise FormatError(f"{hf_dir / 'README.md'}: the model card's front matter cannot be read ({e})") from e
    # llama.cpp's prepare_metadata: the directory name when nothing else names the model; a size label from counts
    if meta.name is None:
        meta.name = hf_dir.resolve().name
    if meta.size_label is None and total > 0:
        meta.size_label = gguf.size_label(total, shared, expert, n_expert)
    collected = gguf.GGUFWriter(None, arch)
    collected.add_type(gguf.GGUFType.MODEL)
    meta.set_gguf_meta_model(collected)
    items: KV = []
    for key, v in collected.kv_data[0].items():
        if key == gguf.Keys.General.ARCHITECTURE or (v.type == gguf.GGUFValueType.ARRAY and not v.value):
            continue  # the stream writes the architecture; an empty card list (tags: []) says nothing
        is_array = v.type == gguf.GGUFValueType.ARRAY
        items.append((key, v.value, gguf.GGUFValueType.get_type(v.value[0]) if is_array else v.type))
    return items
