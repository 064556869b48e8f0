"""The Gated DeltaNet chunk (T tokens in one launch) on the GPU vs T decode steps of gdn_step and the numpy
reference (strata.reference.gdn), state carried in and out."""

import numpy as np
import pytest

from strata.reference.gdn import GdnShape, causal_conv_silu
from support.compare import assert_same_bits, relative_error
from test_kernel_mixers_gdn import EPS, LAYOUTS, assert_matches_reference, random_inputs

pytestmark = pytest.mark.hooks

# Shapes beyond the models' that take the chunk's other paths: dk 64 and 256 (walkers of 8 and 32 rows a
# thread), dk 40 (not a multiple of the 8 warps: guarded rows), dv 48 and 96 (a part-filled 32-column tile),
# conv kernels 3 and 2 (a one-token chunk still reaches into the history, or replaces it whole).
SHAPES = dict(LAYOUTS) | {
    "dk64": GdnShape(2, 4, 64, 96, 4, tiled_heads=True, interleaved_ba=False, sigmoid_gate=True),
    "dk256": GdnShape(1, 2, 256, 32, 2, tiled_heads=False, interleaved_ba=True, sigmoid_gate=False),
    "dk40": GdnShape(3, 6, 40, 48, 3, tiled_heads=False, interleaved_ba=False, sigmoid_gate=True),
}
TOKENS = (1, 3, 64, 333)
# silu(conv) of 2..4 float32 products with the fast exp, against float64: a few ulp of the row's scale.
CONV_RTOL = 1e-5


def starting_state(rng: np.random.Generator, shape: GdnShape, start: str) -> tuple[np.ndarray, np.ndarray]:
    """(conv_state, state): zeros for a fresh sequence, else random as after earlier tokens."""
    conv_shape = (shape.conv_kernel - 1, shape.conv_channels)
    state_shape = (shape.n_v_heads, shape.head_k_dim, shape.head_v_dim)
    if start == "fresh":
        return np.zeros(conv_shape, np.float32), np.zeros(state_shape, np.float32)
    return (rng.standard_normal(conv_shape, dtype=np.float32),
            rng.standard_normal(state_shape, dtype=np.float32) * 0.1)


def run(hook, shape: GdnShape, inputs: dict, conv_state: np.ndarray, state: np.ndarray, **kwargs):
    return hook(inputs["qkv"], inputs["z"], inputs["beta_in"], None if shape.interleaved_ba else inputs["alpha_in"],
                inputs["conv_weight"], inputs["ssm_a"], inputs["dt_bias"], inputs["norm_weight"], conv_state, state,
                n_k_heads=shape.n_k_heads, tiled_heads=shape.tiled_heads, interleaved_ba=shape.interleaved_ba,
                sigmoid_gate=shape.sigmoid_gate, eps=EPS, **kwargs)


def rows(inputs: dict, start: int, stop: int) -> dict:
    """Tokens start..stop-1 of the per-token inputs (the weights unchanged)."""
    per_token = ("qkv", "z", "beta_in", "alpha_in")
    return {name: value[start:stop] if name in per_token else value for name, value in inputs.items()}


@pytest.mark.gpu
@pytest.mark.parametrize("start", ["fresh", "carried"])
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("layout", sorted(SHAPES))
def test_gdn_chunk_matches_steps_and_reference(rng, layout, tokens, start):
    from strata import _native_check

    shape = SHAPES[layout]
    inputs = random_inputs(rng, shape, tokens)
    conv_state, state = starting_state(rng, shape, start)
    out, conv_out, got_conv, got_state = run(_native_check.gdn_chunk, shape, inputs, conv_state, state, row_pad=5)
    step_out, step_conv, step_state = run(_native_check.gdn_steps, shape, inputs, conv_state, state)
    assert_same_bits(out, step_out, f"{layout} T={tokens} {start}: out")
    assert_same_bits(got_conv, step_conv, f"{layout} T={tokens} {start}: conv state")
    assert_same_bits(got_state, step_state, f"{layout} T={tokens} {start}: recurrent state")

    want_conv_out = causal_conv_silu(conv_state, inputs["qkv"], inputs["conv_weight"])
    err = relative_error(conv_out, want_conv_out)
    assert err < CONV_RTOL, f"{layout} T={tokens} {start}: conv_out relative error {err:.2e}"
    assert_matches_reference(shape, inputs, conv_state, state, (out, got_conv, got_state),
                             f"{layout} T={tokens} {start}")


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", (1, 2, 5, 8))
@pytest.mark.parametrize("layout", sorted(SHAPES))
def test_gdn_chunk_row_states_are_each_tokens_state(rng, layout, tokens):
    """A verification step's row states (docs/speculative.md): row t is the state and conv history that t + 1
    steps leave, bit for bit, and keeping them changes nothing else the chunk writes."""
    from strata import _native_check

    shape = SHAPES[layout]
    inputs = random_inputs(rng, shape, tokens)
    conv_state, state = starting_state(rng, shape, "carried")
    out, conv_out, got_conv, got_state, state_rows, conv_rows = run(
        _native_check.gdn_chunk, shape, inputs, conv_state, state, row_pad=3, row_states=True)
    plain = run(_native_check.gdn_chunk, shape, inputs, conv_state, state, row_pad=3)
    for name, got, want in zip(("out", "conv_out", "conv state", "state"), (out, conv_out, got_conv, got_state),
                               plain):
        assert_same_bits(got, want, f"{layout} T={tokens}: {name} with row states")
    for t in range(tokens):
        _, step_conv, step_state = run(_native_check.gdn_steps, shape, rows(inputs, 0, t + 1), conv_state, state)
        assert_same_bits(state_rows[t], step_state, f"{layout} T={tokens}: state row {t}")
        assert_same_bits(conv_rows[t], step_conv, f"{layout} T={tokens}: conv history row {t}")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_gdn_chunks_in_a_row_equal_one_chunk(rng, layout):
    """A prompt in chunks of 64, 2 and 267 tokens, state carried between them, is the prompt in one chunk
    and in 333 steps: the state a chunk leaves is the next chunk's start, bit for bit."""
    from strata import _native_check

    shape = LAYOUTS[layout]
    inputs = random_inputs(rng, shape, 333)
    conv_state, state = starting_state(rng, shape, "carried")
    whole, _, whole_conv, whole_state = run(_native_check.gdn_chunk, shape, inputs, conv_state, state)
    pieces = []
    for start, stop in ((0, 64), (64, 66), (66, 333)):
        out, _, conv_state, state = run(_native_check.gdn_chunk, shape, rows(inputs, start, stop), conv_state, state)
        pieces.append(out)
    assert_same_bits(np.concatenate(pieces), whole, f"{layout}: out")
    assert_same_bits(conv_state, whole_conv, f"{layout}: conv state")
    assert_same_bits(state, whole_state, f"{layout}: recurrent state")


@pytest.mark.gpu
def test_gdn_chunk_refuses_what_the_step_refuses(rng):
    import strata
    from strata import _native_check

    shape = GdnShape(1, 1, 264, 32, 4, tiled_heads=True, interleaved_ba=False, sigmoid_gate=True)  # dk > 256
    inputs = random_inputs(rng, shape, 2)
    conv_state, state = starting_state(rng, shape, "carried")
    with pytest.raises(strata.InvalidArgument, match="gdn_chunk refused the shape"):
        run(_native_check.gdn_chunk, shape, inputs, conv_state, state)


def test_gdn_chunk_arguments_are_checked_before_the_device(rng):
    import strata
    from strata import _native_check

    shape = LAYOUTS["qwen4exp"]
    inputs = random_inputs(rng, shape, 2)
    conv_state, state = starting_state(rng, shape, "carried")
    with pytest.raises(strata.InvalidArgument, match="gdn_chunk z: expected shape"):
        run(_native_check.gdn_chunk, shape, inputs | {"z": inputs["z"][:1]}, conv_state, state)
    with pytest.raises(strata.InvalidArgument, match="row_pad >= 0"):
        run(_native_check.gdn_chunk, shape, inputs, conv_state, state, row_pad=-1)
