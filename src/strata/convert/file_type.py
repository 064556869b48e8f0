"""general.file_type and general.quantization_version: what a file's tensors are, in llama.cpp's names."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import gguf

from strata.errors import InvalidArgument

T = gguf.GGMLQuantizationType
F = gguf.LlamaFileType
# The type that holds most of a file's weights -> its file type. llama.cpp's loader names a file without the key
# this way (llama-model-loader.cpp, its switch on the dominant type) and llama-quantize writes the same names for
# its presets: a K-quant-dominated mix is the _M preset of that K-quant.
_FILE_TYPES = {
    T.F32: F.ALL_F32, T.F16: F.MOSTLY_F16, T.BF16: F.MOSTLY_BF16, T.Q8_0: F.MOSTLY_Q8_0,
    T.Q4_0: F.MOSTLY_Q4_0, T.Q4_1: F.MOSTLY_Q4_1, T.Q5_0: F.MOSTLY_Q5_0, T.Q5_1: F.MOSTLY_Q5_1,
    T.Q2_K: F.MOSTLY_Q2_K, T.Q3_K: F.MOSTLY_Q3_K_M, T.Q4_K: F.MOSTLY_Q4_K_M, T.Q5_K: F.MOSTLY_Q5_K_M,
    T.Q6_K: F.MOSTLY_Q6_K, T.IQ4_NL: F.MOSTLY_IQ4_NL, T.IQ4_XS: F.MOSTLY_IQ4_XS, T.MXFP4: F.MOSTLY_MXFP4_MOE,
}


def file_type(tensors: Iterable[tuple[Sequence[int], T]]) -> gguf.LlamaFileType:
    """The file type of tensors given as (ne, type): that of the type holding the most elements (weights, not
    tensors: the many small F32 norms must not outvote the experts); a tie goes to the type seen first."""
    elements: dict[T, int] = {}
    for ne, ggml_type in tensors:
        elements[ggml_type] = elements.get(ggml_type, 0) + math.prod(ne)
    if not elements:
        raise InvalidArgument("a file with no tensors has no file type")
    dominant = max(elements, key=elements.__getitem__)
    if dominant not in _FILE_TYPES:
        raise InvalidArgument(f"llama.cpp has no file type for a file of mostly {dominant.name} weights")
    return _FILE_TYPES[dominant]


def file_type_metadata(tensors: Iterable[tuple[Sequence[int], T]]) -> list[tuple[str, Any, gguf.GGUFValueType]]:
    """The two keys llama.cpp's converter and quantizer write about the tensors' encoding."""
    U32 = gguf.GGUFValueType.UINT32
    return [(gguf.Keys.General.FILE_TYPE, int(file_type(tensors)), U32),
            (gguf.Keys.General.QUANTIZATION_VERSION, gguf.GGML_QUANT_VERSION, U32)]
