"""RMSNorm variants, L2 norm and NEOX RoPE on the GPU vs the float64 formulas of strata.reference.ops
(docs/models/qwen4exp.md §3 notation)."""

import numpy as np
import pytest

import strata
from support.compare import relative_error
from support.q8_form import assert_q8_of
from support.hooks import native_check as _native_check
from strata.reference.ops import apply_rope, grouped_rms_norm, l2_normalize, rms_norm, rope_tables, sigmoid, silu

pytestmark = pytest.mark.hooks

# float32 sums of up to 2560 squares and a few float32 products (fast exp in the gates): well under 1e-5.
RTOL = 1e-5
EPS = 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "groups", "cols"), [(1, 4, 2560), (3, 4, 2560), (2, 1, 2560), (5, 3, 100)])
def test_grouped_rms_norm(rng, rows, groups, cols):
    x = rng.standard_normal((rows, groups * cols), dtype=np.float32) * np.float32(rng.uniform(0.1, 10))
    w = rng.standard_normal(groups * cols, dtype=np.float32)
    err = relative_error(_native_check.rms_norm_grouped(x, w, groups, EPS), grouped_rms_norm(x, w, groups, EPS))
    assert err < RTOL, f"max relative error {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("gate", ["sigmoid", "silu"])
@pytest.mark.parametrize("heads", [1, 32, 48])
def test_gated_rms_norm(rng, gate, heads):
    x = rng.standard_normal((heads, 128), dtype=np.float32)
    z = rng.standard_normal((heads, 128), dtype=np.float32) * np.float32(3)
    w = rng.standard_normal(128, dtype=np.float32)
    gate_values = sigmoid(z) if gate == "sigmoid" else silu(z)
    want = rms_norm(x, w, EPS) * gate_values
    err = relative_error(_native_check.rms_norm_gated(x, z, w, EPS, gate), want)
    assert err < RTOL, f"{gate}: max relative error {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("gate", ["sigmoid", "silu"])
@pytest.mark.parametrize(("heads", "head_dim"), [(1, 128), (48, 128), (16, 64), (6, 32)])
def test_gated_rms_norm_writes_the_q8_form_of_its_output(rng, gate, heads, head_dim):
    """The GDN's gated norm writes core's q8_32 form for ssm_out: the same output bits as without it, the form
    quantize_q8_32 of that output."""
    x = rng.standard_normal((heads, head_dim), dtype=np.float32) * np.float32(rng.uniform(0.01, 10))
    z = rng.standard_normal((heads, head_dim), dtype=np.float32) * np.float32(3)
    w = rng.standard_normal(head_dim, dtype=np.float32)
    got, q8 = _native_check.rms_norm_gated(x, z, w, EPS, gate, q8=True)
    plain = _native_check.rms_norm_gated(x, z, w, EPS, gate)
    assert np.array_equal(got.view(np.uint32), plain.view(np.uint32)), f"{gate}: the q8 form changed the output"
    assert_q8_of(got, q8, f"rms_norm_gated {gate} {heads}x{head_dim}")


def test_gated_rms_norm_q8_form_needs_whole_blocks_per_head(rng):
    x = rng.standard_normal((4, 16), dtype=np.float32)  # 64 floats, but heads of 16: a CTA would hold half a block
    with pytest.raises(strata.InvalidArgument, match="needs head_dim a multiple of 32, got 16"):
        _native_check.rms_norm_gated(x, x, np.ones(16, np.float32), EPS, "silu", q8=True)


@pytest.mark.gpu
def test_gated_rms_norm_rejects_unknown_gate(rng):
    x = rng.standard_normal((2, 128), dtype=np.float32)
    with pytest.raises(strata.InvalidArgument, match="gate must be 'sigmoid' or 'silu', got 'tanh'"):
        _native_check.rms_norm_gated(x, x, np.ones(128, np.float32), EPS, "tanh")


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [1, 16, 32])
def test_l2_norm(rng, heads):
    x = rng.standard_normal((heads, 128), dtype=np.float32) * np.float32(rng.uniform(0.01, 10))
    err = relative_error(_native_check.l2_norm(x, EPS), l2_normalize(x, EPS))
    assert err < RTOL, f"max relative error {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize(("tokens", "heads", "head_dim", "rope_dim"), [(1, 16, 256, 64), (5, 2, 256, 64), (3, 4, 128, 128)])
def test_rope_neox_partial(rng, tokens, heads, head_dim, rope_dim):
    x = rng.standard_normal((tokens, heads, head_dim), dtype=np.float32)
    positions = rng.integers(0, 300_000, tokens).astype(np.int32)  # far positions: large angles
    positions[0] = 0
    cos, sin = rope_tables(positions, rope_dim, 10_000_000.0)
    want = apply_rope(x, cos, sin)
    got = _native_check.rope_neox(x, positions, rope_dim, 10_000_000.0)
    # cos/sin rounded to float32 (rel 6e-8) and two float32 products: 1e-6 of max |x| is ample.
    err = relative_error(got, want)
    assert err < 1e-6, f"max relative error {err:.2e}"
    assert np.array_equal(got[..., rope_dim:], x[..., rope_dim:]), "dims past rope_dim must pass through"
