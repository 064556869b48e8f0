"""Gated DeltaNet decode step on the GPU vs the numpy reference (strata.reference.gdn), state carried."""

import numpy as np
import pytest

from support.compare import relative_error
from support.q8_form import assert_q8_of
from strata.reference.gdn import GdnShape, causal_conv_silu, delta_rule_step
from strata.reference.ops import l2_normalize, rms_norm, sigmoid, silu, softplus

pytestmark = pytest.mark.hooks

# float32 sums over 128-wide dot products and a few exps per step, against a float64 reference: the error
# stays near 1e-6 of the output scale; 2e-5 leaves room for the fast exp and several carried steps.
RTOL = 2e-5
EPS = 1e-6

LAYOUTS = {
    # qwen4exp: tiled heads (v-head h reads k-head h % Hk), separate beta/alpha, sigmoid gate
    "qwen4exp": GdnShape(2, 6, 128, 128, 4, tiled_heads=True, interleaved_ba=False, sigmoid_gate=True),
    # qwen35moe: tiled heads, SiLU gate
    "qwen35moe": GdnShape(2, 6, 128, 64, 4, tiled_heads=True, interleaved_ba=False, sigmoid_gate=False),
    # qwen3next: grouped heads (h // r), one interleaved ssm_ba projection, SiLU gate
    "qwen3next": GdnShape(2, 6, 128, 128, 4, tiled_heads=False, interleaved_ba=True, sigmoid_gate=False),
}


def reference_steps(shape: GdnShape, inputs: dict, conv_state: np.ndarray, state: np.ndarray):
    """The GDN core of strata.reference.gdn.gdn_forward, one token at a time, on given projections."""
    hk, hv, dk, dv = shape.n_k_heads, shape.n_v_heads, shape.head_k_dim, shape.head_v_dim
    kmap = shape.k_head_of_v_head()
    outs = []
    for t in range(inputs["qkv"].shape[0]):
        qkv = inputs["qkv"][t:t + 1]
        if shape.interleaved_ba:
            r = hv // hk
            ba = inputs["beta_in"][t].reshape(hk, 2 * r)
            b, a = ba[:, :r].reshape(-1), ba[:, r:].reshape(-1)
        else:
            b, a = inputs["beta_in"][t], inputs["alpha_in"][t]
        conv = causal_conv_silu(conv_state, qkv, inputs["conv_weight"]).astype(np.float32)[0]
        conv_state = np.concatenate([conv_state, qkv])[1:]
        q = l2_normalize(conv[:hk * dk].reshape(hk, dk)) / np.sqrt(dk)
        k = l2_normalize(conv[hk * dk:2 * hk * dk].reshape(hk, dk))
        v = conv[2 * hk * dk:].reshape(hv, dv).astype(np.float64)
        decay = inputs["ssm_a"] * softplus(a + inputs["dt_bias"])
        core, s = delta_rule_step(state, q[kmap], k[kmap], v, decay, sigmoid(b))
        state = s.astype(np.float32)
        z = inputs["z"][t].reshape(hv, dv)
        gate = sigmoid(z) if shape.sigmoid_gate else silu(z)
        outs.append((rms_norm(core.astype(np.float32), inputs["norm_weight"], EPS) * gate).reshape(-1))
    return np.array(outs), conv_state, state


def random_inputs(rng: np.random.Generator, shape: GdnShape, steps: int) -> dict:
    hv = shape.n_v_heads
    f = np.float32
    return {
        "qkv": rng.standard_normal((steps, shape.conv_channels), dtype=f),
        "z": rng.standard_normal((steps, hv * shape.head_v_dim), dtype=f),
        "beta_in": rng.standard_normal((steps, 2 * hv if shape.interleaved_ba else hv), dtype=f),
        "alpha_in": rng.standard_normal((steps, hv), dtype=f),
        "conv_weight": rng.standard_normal((shape.conv_channels, shape.conv_kernel), dtype=f) * 0.5,
        "ssm_a": -np.exp(rng.uniform(-1.0, 1.5, hv)).astype(f),
        "dt_bias": rng.standard_normal(hv, dtype=f),
        "norm_weight": rng.uniform(0.5, 1.5, shape.head_v_dim).astype(f),
    }


def assert_matches_reference(shape: GdnShape, inputs: dict, conv_state: np.ndarray, state: np.ndarray,
                             got: tuple, what: str) -> None:
    """got = (out, conv_state, state) of the GPU from the given start: within RTOL of reference_steps, the error
    of out measured on the scale of all its tokens (a token whose gate is small everywhere has small outputs, and
    the RMSNorm before the gate can bring their relative error near RTOL over a few hundred tokens)."""
    want, want_conv, want_state = reference_steps(shape, inputs, conv_state, state)
    err = relative_error(got[0], want)
    assert err < RTOL, f"{what}: output relative error {err:.2e}"
    assert np.array_equal(got[1], want_conv), f"{what}: conv history differs"
    err = relative_error(got[2], want_state)
    assert err < RTOL, f"{what}: recurrent state relative error {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_gdn_steps_match_reference(rng, layout):
    from strata import _native_check

    shape = LAYOUTS[layout]
    steps = 6
    inputs = random_inputs(rng, shape, steps)
    conv_state = rng.standard_normal((shape.conv_kernel - 1, shape.conv_channels), dtype=np.float32)
    state = rng.standard_normal((shape.n_v_heads, shape.head_k_dim, shape.head_v_dim), dtype=np.float32) * 0.1
    got = _native_check.gdn_steps(
        inputs["qkv"], inputs["z"], inputs["beta_in"], None if shape.interleaved_ba else inputs["alpha_in"],
        inputs["conv_weight"], inputs["ssm_a"], inputs["dt_bias"], inputs["norm_weight"], conv_state, state,
        n_k_heads=shape.n_k_heads, tiled_heads=shape.tiled_heads, interleaved_ba=shape.interleaved_ba,
        sigmoid_gate=shape.sigmoid_gate, eps=EPS)
    assert_matches_reference(shape, inputs, conv_state, state, got, layout)


# Heads of 16 values: the gated norm's CTA holds half a block, so gdn_step quantizes core after the norm instead.
Q8_LAYOUTS = {**LAYOUTS, "half-block heads": GdnShape(2, 4, 32, 16, 4, tiled_heads=True, interleaved_ba=False,
                                                       sigmoid_gate=True)}


@pytest.mark.gpu
@pytest.mark.parametrize("layout", sorted(Q8_LAYOUTS))
def test_gdn_steps_write_the_q8_form_of_their_output(rng, layout):
    """gdn_step writes core's q8_32 form for ssm_out beside it: each step's output is the same bits as without it
    (and so the reference's), the form quantize_q8_32 of that output."""
    from strata import _native_check

    shape = Q8_LAYOUTS[layout]
    inputs = random_inputs(rng, shape, 4)
    conv_state = rng.standard_normal((shape.conv_kernel - 1, shape.conv_channels), dtype=np.float32)
    state = rng.standard_normal((shape.n_v_heads, shape.head_k_dim, shape.head_v_dim), dtype=np.float32) * 0.1

    def steps(q8: bool):
        return _native_check.gdn_steps(
            inputs["qkv"], inputs["z"], inputs["beta_in"], None if shape.interleaved_ba else inputs["alpha_in"],
            inputs["conv_weight"], inputs["ssm_a"], inputs["dt_bias"], inputs["norm_weight"], conv_state, state,
            n_k_heads=shape.n_k_heads, tiled_heads=shape.tiled_heads, interleaved_ba=shape.interleaved_ba,
            sigmoid_gate=shape.sigmoid_gate, eps=EPS, q8=q8)

    out, conv, recurrent, q8 = steps(True)
    plain = steps(False)
    assert np.array_equal(out.view(np.uint32), plain[0].view(np.uint32)), f"{layout}: the q8 form changed out"
    assert np.array_equal(recurrent.view(np.uint32), plain[2].view(np.uint32)), f"{layout}: it changed the state"
    assert_matches_reference(shape, inputs, conv_state, state, (out, conv, recurrent), layout)
    for t in range(out.shape[0]):
        assert_q8_of(out[t], tuple(a[t] for a in q8), f"{layout} step {t}")


@pytest.mark.gpu
def test_gdn_head_mappings_differ(rng):
    """Tiled and grouped head maps must give different outputs on the same inputs (the test above would not
    notice a kernel that ignored the flag if both maps coincided)."""
    from strata import _native_check

    shape = LAYOUTS["qwen35moe"]
    inputs = random_inputs(rng, shape, 1)
    conv_state = rng.standard_normal((shape.conv_kernel - 1, shape.conv_channels), dtype=np.float32)
    state = rng.standard_normal((shape.n_v_heads, shape.head_k_dim, shape.head_v_dim), dtype=np.float32) * 0.1
    outs = [
        _native_check.gdn_steps(inputs["qkv"], inputs["z"], inputs["beta_in"], inputs["alpha_in"],
                                inputs["conv_weight"], inputs["ssm_a"], inputs["dt_bias"], inputs["norm_weight"],
                                conv_state, state, n_k_heads=shape.n_k_heads, tiled_heads=tiled,
                                interleaved_ba=False, sigmoid_gate=False, eps=EPS)[0]
        for tiled in (True, False)
    ]
    assert relative_error(outs[0], outs[1]) > 1e-2


def test_gdn_shape_mismatch_is_refused(rng):
    from strata import _native_check
    import strata

    with pytest.raises(strata.InvalidArgument, match="conv_weight has 10 channels"):
        _native_check.gdn_steps(np.ones((1, 10), np.float32), np.ones((1, 4), np.float32), np.ones((1, 1), np.float32),
                          np.ones((1, 1), np.float32), rng.standard_normal((10, 4)), np.ones(1), np.ones(1),
                          np.ones(4), np.ones((3, 10)), np.ones((1, 4, 4)), n_k_heads=1, tiled_heads=True,
                          interleaved_ba=False, sigmoid_gate=True, eps=EPS)


def test_gdn_q8_form_needs_whole_blocks(rng):
    """A q8_32 form of core needs Hv * dv a multiple of 32 (2 heads of 8 values: 16), refused before the device."""
    from strata import _native_check
    import strata

    shape = GdnShape(1, 2, 8, 8, 4, tiled_heads=True, interleaved_ba=False, sigmoid_gate=True)
    inputs = random_inputs(rng, shape, 1)
    refused = r"gdn_steps: a q8_32 output needs Hv \* dv a multiple of 32, got 16"
    with pytest.raises(strata.InvalidArgument, match=refused):
        _native_check.gdn_steps(inputs["qkv"], inputs["z"], inputs["beta_in"], inputs["alpha_in"],
                                inputs["conv_weight"], inputs["ssm_a"], inputs["dt_bias"], inputs["norm_weight"],
                                np.zeros((3, shape.conv_channels), np.float32), np.zeros((2, 8, 8), np.float32),
                                n_k_heads=1, tiled_heads=True, interleaved_ba=False, sigmoid_gate=True, eps=EPS,
                                q8=True)
