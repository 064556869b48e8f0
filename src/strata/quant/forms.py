"""The canonical weight forms of docs/forms.md and the GGUF types each one holds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T

from strata.errors import FormatError

# IQ4_NL's non-linear 4-bit grid (also IQ4_XS's), and MXFP4's e2m1 values doubled so they are integers.
IQ4_NL_CODEBOOK = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
MXFP4_CODEBOOK = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
# The lattice i-quants hold each weight as a signed grid magnitude: code = magnitude index | sign << 3
# (repack_kernels.py builds the codes; unused entries are 0). The grids' magnitudes, from gguf.quants:
IQ2_CODEBOOK = (8, 25, 43, 0, 0, 0, 0, 0, -8, -25, -43, 0, 0, 0, 0, 0)  # IQ2_XXS, IQ2_XS, IQ2_S
IQ3_XXS_CODEBOOK = (4, 12, 20, 28, 36, 44, 52, 62, -4, -12, -20, -28, -36, -44, -52, -62)
IQ3_S_CODEBOOK = (1, 3, 5, 7, 9, 11, 13, 15, -1, -3, -5, -7, -9, -11, -13, -15)
# IQ1_S / IQ1_M: 8 * (g + delta) for g in {-1, 0, 1} and delta = +-1/8: code = (g + 1) | (delta < 0) << 2.
IQ1_CODEBOOK = (-7, 1, 9, 0, -9, -1, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0)

BLOCK = 32  # codes are packed, and activations quantized, per 32 consecutive elements of a row


@dataclass(frozen=True)
class Form:
    """How one tensor is held: a float kind (``float_kind`` set) or the quantized planes of docs/forms.md.

    ``name`` is the GGUF type the form was made for (lower case); two types never share a name.
    """

    name: str
    float_kind: str | None = None  # "f32", "f16", "bf16" for float forms, else None
    code_bits: int = 0
    code_bias: int = 0
    codebook: tuple[int, ...] | None = None
    group_size: int = 0
    super_size: int = 0
    scale_dtype: str = "float16"
    has_sub_scales: bool = False
    has_mins: bool = False

    @property
    def is_float(self) -> bool:
        return self.float_kind is not None

    @property
    def has_sub_mins(self) -> bool:
        return self.has_mins and self.has_sub_scales

    @property
    def code_bytes_per_block(self) -> int:
        """Bytes of ``codes`` per 32-element block."""
        return BLOCK * self.code_bits // 8

    def values(self) -> np.ndarray:
        """The signed integer value of every possible code (int16), i.e. ``v`` of docs/forms.md."""
        if self.codebook is not None:
            return np.array(self.codebook, dtype=np.int16)
        return np.arange(1 << self.code_bits, dtype=np.int16) - np.int16(self.code_bias)


def _quant(name: str, bits: int, bias: int, group: int, super_: int, *, sub_scales: bool = False,
           mins: bool = False, codebook: tuple[int, ...] | None = None, scale_dtype: str = "float16") -> Form:
    return Form(name=name, code_bits=bits, code_bias=bias, codebook=codebook, group_size=group,
                super_size=super_, scale_dtype=scale_dtype, has_sub_scales=sub_scales, has_mins=mins)


# One row per GGUF type, as the table "From GGUF types" of docs/forms.md.
FORMS: dict[T, Form] = {
    T.F32: Form(name="f32", float_kind="f32"),
    T.F16: Form(name="f16", float_kind="f16"),
    T.BF16: Form(name="bf16", float_kind="bf16"),
    T.Q8_0: _quant("q8_0", 8, 128, 32, 32),
    T.Q4_0: _quant("q4_0", 4, 8, 32, 32),
    T.Q4_1: _quant("q4_1", 4, 0, 32, 32, mins=True),
    T.Q5_0: _quant("q5_0", 8, 16, 32, 32),
    T.Q5_1: _quant("q5_1", 8, 0, 32, 32, mins=True),
    T.Q2_K: _quant("q2_k", 2, 0, 16, 256, sub_scales=True, mins=True),
    T.Q3_K: _quant("q3_k", 8, 4, 16, 256, sub_scales=True),
    T.Q4_K: _quant("q4_k", 4, 0, 32, 256, sub_scales=True, mins=True),
    T.Q5_K: _quant("q5_k", 8, 0, 32, 256, sub_scales=True, mins=True),
    T.Q6_K: _quant("q6_k", 8, 32, 16, 256, sub_scales=True),
    T.IQ4_NL: _quant("iq4_nl", 4, 0, 32, 32, codebook=IQ4_NL_CODEBOOK),
    T.IQ4_XS: _quant("iq4_xs", 4, 0, 32, 256, sub_scales=True, codebook=IQ4_NL_CODEBOOK),
    T.MXFP4: _quant("mxfp4", 4, 0, 32, 32, codebook=MXFP4_CODEBOOK, scale_dtype="float32"),
    # d folds a power of two out of the type's group scale (d * 2^-k, exact in float32 only), so these hold d
    # as float32; sub_scales = 2 * ls + 1 (repack_kernels.py proves the float32 order is unchanged).
    T.IQ2_XXS: _quant("iq2_xxs", 4, 0, 32, 256, sub_scales=True, codebook=IQ2_CODEBOOK, scale_dtype="float32"),
    T.IQ2_XS: _quant("iq2_xs", 4, 0, 16, 256, sub_scales=True, codebook=IQ2_CODEBOOK, scale_dtype="float32"),
    T.IQ2_S: _quant("iq2_s", 4, 0, 16, 256, sub_scales=True, codebook=IQ2_CODEBOOK, scale_dtype="float32"),
    T.IQ3_XXS: _quant("iq3_xxs", 4, 0, 32, 256, sub_scales=True, codebook=IQ3_XXS_CODEBOOK, scale_dtype="float32"),
    T.IQ3_S: _quant("iq3_s", 4, 0, 32, 256, sub_scales=True, codebook=IQ3_S_CODEBOOK),
    T.IQ1_S: _quant("iq1_s", 4, 0, 32, 256, sub_scales=True, codebook=IQ1_CODEBOOK, scale_dtype="float32"),
    T.IQ1_M: _quant("iq1_m", 4, 0, 16, 256, sub_scales=True, codebook=IQ1_CODEBOOK, scale_dtype="float32"),
    # Ternary: code = q + 1. The kernels know 256-element super-blocks only with sub-scales: theirs are all 1.
    T.TQ1_0: _quant("tq1_0", 2, 1, 32, 256, sub_scales=True),
    T.TQ2_0: _quant("tq2_0", 2, 1, 32, 256, sub_scales=True),
}
_BY_NAME = {form.name: form for form in FORMS.values()}
# numpy dtype of a float form's array; bf16 has no numpy dtype and is held as its raw uint16 bits.
FLOAT_DTYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": np.dtype(np.uint16)}


# What llama-quantize writes instead of a type of 256-element super-blocks where a row is not whole super-blocks
# (qwen4exp's expert down has 640 columns): its tensor-type fallback.
QUANTIZE_FALLBACK = {
    T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0, T.IQ4_XS: T.IQ4_NL,
    **dict.fromkeys((T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M), T.IQ4_NL),
    T.TQ1_0: T.Q4_0, T.TQ2_0: T.Q4_0,
}


def fitting_type(ggml_type: T, cols: int) -> T:
    """``ggml_type``, or what llama-quantize writes instead for rows of ``cols`` elements."""
    return QUANTIZE_FALLBACK[ggml_type] if cols % 256 and ggml_type in QUANTIZE_FALLBACK else ggml_type


def form_for(ggml_type: T | int) -> Form:
    """The form that holds ``ggml_type`` bit-exactly; FormatError naming the type if none does."""
    try:
        ggml_type = T(ggml_type)
    except ValueError:
        raise FormatError(f"unknown ggml type id {ggml_type!r}; strata holds {supported_names()}") from None
    form = FORMS.get(ggml_type)
    if form is None:
        raise FormatError(f"ggml type {ggml_type.name} has no canonical form; strata holds {supported_names()}")
    return form


def form_named(name: str) -> Form:
    """The form called ``name`` (e.g. "q4_k"); FormatError if there is none."""
    form = _BY_NAME.get(name)
    if form is None:
        raise FormatError(f"no canonical form named {name!r}; known: {sorted(_BY_NAME)}")
    return form


def float_form_of(array: np.ndarray) -> Form:
    """The float form of an array that ``repack`` returned (uint16 means bf16 bits)."""
    for kind, dtype in FLOAT_DTYPES.items():
        if array.dtype == dtype:
            return _BY_NAME[kind]
    raise FormatError(f"array of dtype {array.dtype} is no float form; expected float32, float16 or uint16 (bf16)")


def supported_names() -> str:
    return ", ".join(t.name for t in FORMS)
