"""Random tensor bytes of any supported GGML type, made directly (never by quantizing floats).

Quantized blocks are random bytes whose fp16 scale fields are then overwritten with a controlled value,
so every code is random and every weight has the intended magnitude. Floats are random sign and mantissa
bits under a fixed exponent: values uniform in ±[s, 2s). The random bytes come from a seeded pool XORed
with a per-chunk key: one memory pass per byte, in numpy calls that release the GIL, so threads scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import gguf
import numpy as np

from strata.errors import InvalidArgument

T = gguf.GGMLQuantizationType
POOL_BYTES = 64 << 20


@dataclass(frozen=True)
class Layout:
    """Where a block keeps its fp16 scales: (byte offset, multiple of d) for each; K-quant mins are negative
    offsets, so `dmin = d * mean code` centres the weights near zero."""
    scales: tuple[tuple[int, float], ...]


LAYOUTS: dict[T, Layout] = {
    T.Q8_0: Layout(((0, 1.0),)),
    T.Q4_0: Layout(((0, 1.0),)),
    T.Q4_1: Layout(((0, 1.0), (2, -7.5))),
    T.Q5_0: Layout(((0, 1.0),)),
    T.Q5_1: Layout(((0, 1.0), (2, -15.5))),
    T.IQ4_NL: Layout(((0, 1.0),)),
    T.Q2_K: Layout(((80, 1.0), (82, 1.5))),
    T.Q3_K: Layout(((108, 1.0),)),
    T.Q4_K: Layout(((0, 1.0), (2, 7.5))),
    T.Q5_K: Layout(((0, 1.0), (2, 15.5))),
    T.Q6_K: Layout(((208, 1.0),)),
    T.IQ4_XS: Layout(((0, 1.0),)),
}
FLOATS = {T.F32: (np.uint32, 23, 127), T.F16: (np.uint16, 10, 15), T.BF16: (np.uint16, 7, 127)}


def supported(ggml_type: T) -> bool:
    return ggml_type in LAYOUTS or ggml_type in FLOATS


def pool(seed: int) -> np.ndarray:
    """The random bytes every chunk is drawn from (uint64 words)."""
    return np.random.Generator(np.random.SFC64(np.random.SeedSequence([seed, 0x5EED]))).bit_generator.random_raw(
        POOL_BYTES // 8)


def random_bytes(words: np.ndarray, key: tuple[int, ...], n: int, out: np.ndarray) -> np.ndarray:
    """n pseudo-random bytes into `out` (uint8, >= n rounded up to 8): a pool slice XOR a 64-bit key."""
    rng = np.random.Generator(np.random.SFC64(np.random.SeedSequence(list(key))))
    n_words = -(-n // 8)
    start = int(rng.integers(0, len(words) - n_words + 1))
    dst = out[: n_words * 8].view(np.uint64)
    np.bitwise_xor(words[start:start + n_words], rng.integers(0, 2**64, dtype=np.uint64) | np.uint64(1), out=dst)
    return out[:n]


def _fp16_bytes(value: float) -> np.ndarray:
    return np.array([value], dtype=np.float16).view(np.uint8)


def fill_quant(buf: np.ndarray, ggml_type: T, d: float) -> None:
    """Overwrite the scale fields of every block in `buf` (random bytes, whole blocks) with d * multiple."""
    size = gguf.GGML_QUANT_SIZES[ggml_type][1]
    blocks = buf.reshape(-1, size)
    for offset, multiple in LAYOUTS[ggml_type].scales:
        blocks[:, offset:offset + 2] = _fp16_bytes(d * multiple)


def fill_float(buf: np.ndarray, ggml_type: T, s: float) -> None:
    """Turn random bytes into floats uniform in ±[s', 2s'), s' the power of two nearest s."""
    word, mantissa_bits, bias = FLOATS[ggml_type]
    w = buf.view(word)
    exponent = int(np.round(np.log2(s))) + bias
    if not 0 < exponent < 2 * bias:
        raise InvalidArgument(f"{ggml_type.name} cannot hold random values of scale {s}")
    sign_and_mantissa = word((1 << (8 * w.itemsize - 1)) | ((1 << mantissa_bits) - 1))
    np.bitwise_and(w, sign_and_mantissa, out=w)
    np.bitwise_or(w, word(exponent << mantissa_bits), out=w)


@cache
def unit_rms(ggml_type: T) -> float:
    """RMS of the weights this module makes with d = 1 (measured once by dequantizing a sample)."""
    size = gguf.GGML_QUANT_SIZES[ggml_type][1]
    n = 256 * size
    buf = np.empty(n + 8, np.uint8)
    sample = random_bytes(pool(0)[: 1 << 16], (0, 1), n, buf)
    fill_quant(sample, ggml_type, 1.0)
    values = gguf.quants.dequantize(sample, ggml_type)
    return float(np.sqrt(np.mean(np.square(values, dtype=np.float64))))


def scale_for(ggml_type: T, rms: float) -> float:
    """The d (quantized) or s (float) that gives weights of root-mean-square `rms`."""
    if ggml_type in FLOATS:
        return rms / np.sqrt(7 / 3)       # |x| uniform in [s, 2s): mean square 7/3 s^2 (s then rounded to a power of 2)
    return rms / unit_rms(ggml_type)
