"""The ggml tensor types strata accepts: those a canonical weight form holds exactly (docs/forms.md)."""

from __future__ import annotations

import gguf

T = gguf.GGMLQuantizationType

FLOAT_TYPES = frozenset({T.F32, T.F16, T.BF16})
ACCEPTED_TYPES = FLOAT_TYPES | {T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
                                T.IQ4_NL, T.IQ4_XS, T.MXFP4, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S,
                                T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0}


def block_layout(ggml_type: T) -> tuple[int, int]:
    """(elements per block, bytes per block)."""
    return gguf.GGML_QUANT_SIZES[ggml_type]


def type_name(code: int) -> str:
    try:
        return T(code).name
    except ValueError:
        return f"unknown ggml type {code}"
