"""Random but well-formed GGUF blocks of every supported type, for tests and benchmarks.

Code bytes are uniformly random; every scale field is a finite value from a controlled range (never
NaN or Inf), so dequantized weights are finite and comparisons are meaningful.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from strata.errors import InvalidArgument
from strata.quant.forms import form_for

# Byte offsets of the fp16 scale fields inside each type's block.
FP16_SCALE_OFFSETS: dict[T, tuple[int, ...]] = {
    T.Q8_0: (0,), T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2),
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
    T.IQ4_NL: (0,), T.IQ4_XS: (0,), T.IQ2_XXS: (0,), T.IQ2_XS: (0,), T.IQ2_S: (0,), T.IQ3_XXS: (0,), T.IQ3_S: (0,),
    T.IQ1_S: (0,), T.TQ1_0: (52,), T.TQ2_0: (64,),
}
IQ1_M_SCALE_WORDS = 48  # IQ1_M has no d field: its fp16 bits are the top nibbles of the 4 uint16 at this offset
# MXFP4's e8m0 exponent byte: 2^(e-128) over about 2^-28 .. 2^-8, like real weights' scales.
MXFP4_EXPONENTS = (100, 120)


def random_scales(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` finite fp16 scales of random sign, magnitudes spread over 2^-20 .. 2 (subnormals included)."""
    magnitude = np.exp2(rng.uniform(-20.0, 1.0, n))
    return (magnitude * rng.choice([-1.0, 1.0], n)).astype(np.float16)


def random_blocks(ggml_type: T | int, n_elements: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 bytes of ``n_elements`` weights of ``ggml_type`` (a multiple of its block size)."""
    ggml_type = T(ggml_type)
    form_for(ggml_type)  # FormatError for a type strata does not hold
    block_size, type_size = GGML_QUANT_SIZES[ggml_type]
    n_blocks = n_elements // block_size
    if n_elements % block_size:
        raise InvalidArgument(f"{ggml_type.name}: {n_elements} elements are not whole blocks of {block_size}")
    if ggml_type in (T.F32, T.F16, T.BF16):
        values = rng.standard_normal(n_elements, dtype=np.float32)
        if ggml_type == T.F16:
            return values.astype(np.float16).view(np.uint8)
        if ggml_type == T.BF16:  # truncating the low half of an f32 keeps it finite
            return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return values.view(np.uint8)
    blocks = np.frombuffer(rng.bytes(n_blocks * type_size), dtype=np.uint8).reshape(n_blocks, type_size).copy()
    if ggml_type == T.MXFP4:
        blocks[:, 0] = rng.integers(*MXFP4_EXPONENTS, size=n_blocks, endpoint=True, dtype=np.uint8)
    for offset in FP16_SCALE_OFFSETS.get(ggml_type, ()):
        blocks[:, offset:offset + 2] = random_scales(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    if ggml_type == T.IQ1_M:
        set_d(blocks, ggml_type, random_scales(rng, n_blocks))
    return blocks.reshape(-1)


def set_d(blocks: np.ndarray, ggml_type: T, d: np.ndarray) -> None:
    """Writes fp16 ``d`` as the super-block scale of each block (uint8 ``[n, type_size]``): its first fp16
    field, or for IQ1_M, which has none, the top nibbles of its 4 scale words (lowest nibble first)."""
    bits = d.astype(np.float16).view(np.uint16)
    if ggml_type != T.IQ1_M:
        offset = FP16_SCALE_OFFSETS[ggml_type][0]
        blocks[:, offset:offset + 2] = bits.view(np.uint8).reshape(-1, 2)
        return
    words = blocks[:, IQ1_M_SCALE_WORDS:IQ1_M_SCALE_WORDS + 8].view(np.uint16)
    words &= np.uint16(0x0FFF)
    words |= (bits[:, None] >> np.array([0, 4, 8, 12], dtype=np.uint16)) << np.uint16(12)
