"""repack + dequantize against gguf.quants, bit for bit, for every type docs/forms.md holds."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import strata.quant.repacking as repacking
from strata.errors import FormatError
from strata.quant import dequantize, dequantize_raw, form_for, repack
from strata.quant.dequant import unpack_codes
from strata.format.types import ACCEPTED_TYPES
from strata.quant.forms import FORMS
from strata.quant.synthetic import random_blocks, set_d
from strata.quant.tensor import QuantTensor
from support.compare import assert_same_bits

TYPES = list(FORMS)
QUANTIZED = [t for t in TYPES if not form_for(t).is_float]
# Types whose form folds a power of two out of d (float32 d) or keeps d (IQ3_S, ternary) around new grids.
LATTICE = [T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0]
FINITE_FP16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
FINITE_FP16 = FINITE_FP16[np.isfinite(FINITE_FP16)]  # +-0, subnormals, normals up to +-65504


@pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)
def test_dequantize_of_repack_is_bit_exact(ggml_type: T, rng: np.random.Generator) -> None:
    for _ in range(3):
        rows = int(rng.integers(1, 65))
        cols = 256 * int(rng.integers(1, 11))  # 256 .. 2560: whole blocks for every type
        raw = random_blocks(ggml_type, rows * cols, rng)
        want = gguf.quants.dequantize(raw.reshape(rows, -1), ggml_type).reshape(rows, cols)
        got = dequantize(repack(raw, ggml_type, (cols, rows)))
        assert_same_bits(got, want, f"{ggml_type.name} rows={rows} cols={cols}")


@pytest.mark.parametrize("ggml_type", LATTICE, ids=lambda t: t.name)
def test_lattice_types_are_bit_exact_for_every_finite_d(ggml_type: T, rng: np.random.Generator) -> None:
    """The fold of d * 2^-k into a float32 d (repack_lattice.py's proof), checked on each of the 63488 finite
    fp16 values of d, one 256-weight block each, every other byte random."""
    n = FINITE_FP16.size
    raw = random_blocks(ggml_type, 256 * n, rng)
    set_d(raw.reshape(n, -1), ggml_type, rng.permutation(FINITE_FP16))
    want = gguf.quants.dequantize(raw.reshape(n, -1), ggml_type).reshape(n, 256)
    assert_same_bits(dequantize(repack(raw, ggml_type, (256, n))), want, f"{ggml_type.name}, every finite d")


@pytest.mark.parametrize("ggml_type", [T.Q4_0, T.Q8_0, T.Q4_K, T.Q2_K, T.Q6_K, T.MXFP4, T.IQ2_S, T.IQ1_M, T.TQ1_0],
                         ids=lambda t: t.name)
def test_threaded_chunks_match_one_pass(ggml_type: T, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    rows, cols = 48, 1024
    raw = random_blocks(ggml_type, rows * cols, rng)
    whole = repack(raw, ggml_type, (cols, rows), threads=1)
    monkeypatch.setattr(repacking, "CHUNK_BYTES", 1000)  # many uneven chunks over 3 threads
    chunked = repack(raw, ggml_type, (cols, rows), threads=3)
    for name, plane in whole.planes().items():
        assert np.array_equal(plane.view(np.uint8), chunked.planes()[name].view(np.uint8)), name


def test_expert_tensor_and_dequantize_raw_shape(rng: np.random.Generator) -> None:
    ne = (512, 6, 4)  # {cols, rows, experts}
    raw = random_blocks(T.Q4_K, 512 * 6 * 4, rng)
    got = dequantize_raw(raw, T.Q4_K, ne)
    assert got.shape == (4, 6, 512)
    assert_same_bits(got.reshape(24, 512), gguf.quants.dequantize(raw.reshape(24, -1), T.Q4_K), "Q4_K experts")


@pytest.mark.parametrize("ggml_type", [T.F32, T.F16, T.BF16], ids=lambda t: t.name)
def test_float_forms_are_views_of_the_data(ggml_type: T, rng: np.random.Generator) -> None:
    raw = random_blocks(ggml_type, 8 * 64, rng)
    array = repack(raw, ggml_type, (64, 8))
    assert array.shape == (8, 64) and np.shares_memory(array, raw)


@pytest.mark.parametrize("form_type", QUANTIZED, ids=lambda t: t.name)
def test_planes_have_the_documented_shapes(form_type: T) -> None:
    form = form_for(form_type)
    q = QuantTensor.empty(form, 3, 512)
    assert q.codes.shape == (3, 512 * form.code_bits // 8)
    assert q.d.shape == (3, 512 // form.super_size) and q.d.dtype == np.dtype(form.scale_dtype)
    assert (q.sub_scales is not None) == (form.group_size != form.super_size)
    assert (q.sub_mins is not None) == (form.has_mins and form.group_size != form.super_size)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_code_packing_follows_the_doc(bits: int, rng: np.random.Generator) -> None:
    form = next(form_for(t) for t in QUANTIZED if form_for(t).code_bits == bits)
    packed = rng.integers(0, 256, size=(2, 64 * bits // 8), dtype=np.uint8)  # 2 rows of 64 codes
    got = unpack_codes(form, packed)
    per_byte = 8 // bits
    for row in range(2):
        for block in range(2):
            data = packed[row, block * 4 * bits:(block + 1) * 4 * bits]
            for j, byte in enumerate(data):  # docs/forms.md: byte j holds code j + (32 / per_byte) * i at bits i*bits
                for i in range(per_byte):
                    code = (int(byte) >> (i * bits)) & ((1 << bits) - 1)
                    assert got[row, block * 32 + j + i * (32 // per_byte)] == code, (bits, row, block, j, i)


@pytest.mark.parametrize("ggml_type", [T.Q8_K, T.Q8_1, T.Q1_0, T.I32, T.F64], ids=lambda t: t.name)
def test_types_without_a_form_are_refused_by_name(ggml_type: T) -> None:
    with pytest.raises(FormatError, match=ggml_type.name):
        form_for(ggml_type)
    with pytest.raises(FormatError, match=ggml_type.name):
        repack(np.zeros(4096, np.uint8), ggml_type, (256, 1))


def test_the_scanner_accepts_exactly_the_held_types() -> None:
    assert ACCEPTED_TYPES == set(FORMS)


def test_wrong_sizes_are_format_errors(rng: np.random.Generator) -> None:
    raw = random_blocks(T.Q4_K, 512, rng)
    with pytest.raises(FormatError, match="blk.0.ffn_up.weight.*bytes"):
        repack(raw[:-1], T.Q4_K, (512, 1), name="blk.0.ffn_up.weight")
    with pytest.raises(FormatError, match="whole blocks of 256"):
        repack(raw, T.Q4_K, (128, 4))
    with pytest.raises(FormatError, match="positive"):
        repack(raw, T.Q4_K, (512, 0))
