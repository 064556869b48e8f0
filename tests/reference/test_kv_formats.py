"""The numpy definition of the KV formats (strata.reference.kv_formats), checked on its own: the rotation is the
orthonormal block Walsh-Hadamard transform and its own inverse, each code rounds within half a step, the
formats' halves are the documented ones, and the reference's caches hold what the format holds."""

import dataclasses

import numpy as np
import pytest

from strata.errors import InvalidArgument
from strata.options import KV
from strata.reference import kv_formats as kf
from strata.reference.attention import AttentionShape, KvState

HEAD_DIMS = [32, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512]


def hadamard_rotation(head_dim: int) -> np.ndarray:
    """The rotation as a matrix, built independently: block-diagonal Sylvester H_n / sqrt(n)."""
    n = kf.rotation_width(head_dim)
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return np.kron(np.eye(head_dim // n), h / np.sqrt(n))


def rows(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("head_dim, width", [(32, 32), (64, 64), (96, 32), (128, 128), (160, 32), (192, 64),
                                             (256, 256), (320, 64), (384, 128), (448, 64), (512, 256)])
def test_rotation_width_is_the_widest_power_of_two_block_up_to_256(head_dim, width):
    assert kf.rotation_width(head_dim) == width


@pytest.mark.parametrize("head_dim", [0, 16, 100, -32])
def test_a_head_dim_the_groups_cannot_tile_is_refused(head_dim):
    with pytest.raises(InvalidArgument, match=f"KV head_dim {head_dim} is not a positive multiple of 32"):
        kf.rotation_width(head_dim)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_the_rotation_is_orthonormal_and_its_own_inverse(rng, head_dim):
    x = rng.standard_normal((7, 3, head_dim))
    matrix = hadamard_rotation(head_dim)
    assert np.allclose(matrix @ matrix.T, np.eye(head_dim), atol=1e-12)
    assert np.abs(kf.rotate(x) - x @ matrix.T).max() <= 1e-12 * np.abs(x).max()
    assert np.abs(kf.rotate(kf.rotate(x)) - x).max() <= 1e-12 * np.abs(x).max()
    assert np.allclose(np.linalg.norm(kf.rotate(x), axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-12)
    # float32, in the GPU's order: up to 2 log2(n) = 16 roundings of partial sums; measured <= 1.6e-7 of max|x|
    # over 10^4 rows of each width, bounded by 1e-6.
    x32 = x.astype(np.float32)
    once = kf.rotate(x32)
    assert once.dtype == np.float32
    assert np.abs(kf.rotate(once) - x32).max() <= 1e-6 * np.abs(x32).max()
    assert np.abs(once - kf.rotate(x32.astype(np.float64))).max() <= 1e-6 * np.abs(x32).max()


@pytest.mark.parametrize("codes", [kf.INT8, kf.Q4], ids=lambda c: c.name)
def test_codes_round_within_half_a_step(rng, codes):
    x = rows(rng, (64, 8, 256))
    x[0, 0, :32] = 0.0                               # an all-zero group: scale 0, codes 0, exact
    x[1, 0, 5] = 40.0                                # an outlier sets its group's scale
    x[2, 1, :32] = np.linspace(-1.0, 1.0, 32)        # both ends of the range: -8 and the clamp at 7
    q, d = kf.quantize(x, codes)
    assert q.dtype == np.int8 and d.dtype == np.float16 and d.shape == (64, 8, 8)
    assert q.min() >= codes.lo and q.max() <= codes.hi
    assert q.min() == codes.lo or codes is kf.INT8   # q4 uses the whole grid -8..7
    step = np.repeat(d.astype(np.float64), 32, axis=-1)
    err = np.abs(kf.dequantize(q, d) - x)
    # round(x / d) is within d / 2; d = amax / top rounded to fp16 (relative 2^-11) can leave amax up to
    # top * 2^-11 steps past the grid's last point, which only q4's clamp at 7 (0.5 below top) reaches.
    allowed = step * (0.5 + (codes.top * 2.0**-11 if codes is kf.Q4 else 0.0))
    assert np.all(err <= allowed), f"{codes.name}: worst error {np.max(err / np.maximum(step, 1e-30)):.4f} steps"
    assert np.all(kf.dequantize(q, d)[0, 0, :32] == 0.0)
    amax = np.abs(x.reshape(64, 8, 8, 32)).max(axis=-1)
    assert np.allclose(d.astype(np.float64), amax / codes.top, rtol=2.0**-11)


def test_q4_rounds_the_ends_of_the_range_to_the_grid_ends():
    x = np.zeros((1, 32), np.float32)
    x[0, :2] = [-7.5, 7.5]  # amax 7.5: d = 1 exactly
    q, d = kf.quantize(x, kf.Q4)
    assert float(d[0, 0]) == 1.0 and q[0, 0] == -8 and q[0, 1] == 7  # -7.5 ties to even -8; 7.5 -> 8 clamps to 7


@pytest.mark.parametrize("head_dim", [96, 128, 256])
def test_cached_and_held_rows(rng, head_dim):
    x = rows(rng, (3, 5, head_dim), 2.0)
    assert np.array_equal(kf.cached(x, kf.BF16), kf.bf16_round(x))
    assert np.array_equal(kf.held(x, kf.INT8), kf.dequantize(*kf.quantize(x, kf.INT8)))
    rotated = kf.rotate(x)
    assert np.array_equal(kf.cached(x, kf.Q4), kf.dequantize(*kf.quantize(rotated, kf.Q4)))
    # held rotates back: its error has the rotated error's length (orthonormal), row by row.
    err_held = np.linalg.norm(kf.held(x, kf.Q4) - x, axis=-1)
    err_rotated = np.linalg.norm(kf.cached(x, kf.Q4) - rotated, axis=-1)
    assert np.allclose(err_held, err_rotated, rtol=1e-4, atol=1e-6)


def test_the_rotation_spreads_an_outlier_over_the_row(rng):
    """The rotation's purpose: one large element no longer sets a 32-group's step for its 31 neighbours."""
    x = rows(rng, (64, 256))
    x[np.arange(64), rng.integers(0, 256, 64)] = 30.0
    plain = kf.dequantize(*kf.quantize(x, kf.Q4))
    assert np.linalg.norm(kf.held(x, kf.Q4) - x) < 0.75 * np.linalg.norm(plain - x)


def test_each_format_has_its_documented_halves():
    assert kf.halves("bf16") == (kf.BF16, kf.BF16)
    assert kf.halves(KV.INT8) == (kf.INT8, kf.INT8)
    assert kf.halves("K8V4") == (kf.INT8, kf.Q4)  # int8 keys are not rotated; q4 values are
    assert kf.halves(KV.Q4) == (kf.Q4, kf.Q4)
    assert set(KV) == {KV.BF16, KV.INT8, KV.K8V4, KV.Q4}
    with pytest.raises(InvalidArgument, match="unknown KV format 'q2'"):
        kf.halves("q2")


@pytest.mark.parametrize("kv", list(KV))
def test_the_reference_cache_holds_the_format(rng, kv):
    shape = AttentionShape(4, 2, 64)
    state, exact = KvState(shape, kv), KvState(shape)
    for t in (3, 1, 4):
        k, v = rows(rng, (2, t, 64)), rows(rng, (2, t, 64))
        state.append(k, v)
        exact.append(k, v)
    key_codes, value_codes = kf.halves(kv)
    assert state.k.shape == state.v.shape == (2, 8, 64)
    assert np.array_equal(state.k, kf.held(exact.k, key_codes))
    assert np.array_equal(state.v, kf.held(exact.v, value_codes))


def test_the_reference_refuses_a_format_its_head_dim_cannot_hold():
    from strata.models import released
    from strata.reference import Reference

    g = dataclasses.replace(released("qwen4exp"), head_dim=48)
    with pytest.raises(InvalidArgument, match="kv=q4: head_dim 48 is not a multiple of 32"):
        Reference(geometry=g, weights={}, kv="q4")
    Reference(geometry=g, weights={})  # float32 caches take any head_dim
