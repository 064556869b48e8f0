"""The PLE block's device half (norms, signed-sqrt gate, dilated conv + history) vs strata.reference.ple, and the
chunk kernel (all of a prompt chunk's tokens in one call) against the decode kernel run once per token."""

import numpy as np
import pytest

from strata.reference.ops import grouped_rms_norm, sigmoid
from strata.reference.ple import dilated_conv_silu
from support.compare import assert_same_bits

pytestmark = pytest.mark.hooks

EPS = 1e-6
# float32 sums over 2560-wide rows and a sqrt/exp gate, against float64: ~1e-6; 2e-5 of the output scale.
RTOL = 2e-5


def reference_steps(streams, key, value, norm_key, norm_query, norm_conv, conv_weight, history, dilation):
    """ple_forward's tail (strata.reference.ple) one token at a time, on given key/value projections."""
    outs = []
    for t in range(streams.shape[0]):
        _, hc, n = streams.shape
        k = grouped_rms_norm(key[t], norm_key, hc, EPS).reshape(hc, n)
        q = grouped_rms_norm(streams[t].reshape(-1), norm_query, hc, EPS).reshape(hc, n)
        score = np.sum(k * q, axis=-1) / np.sqrt(n)
        score = np.sign(score) * np.sqrt(np.maximum(np.abs(score), 1e-6))
        gated = (sigmoid(score)[:, None] * value[t].astype(np.float64)[None, :]).astype(np.float32)
        normed = grouped_rms_norm(gated.reshape(1, -1), norm_conv, hc, EPS).astype(np.float32)
        conv = dilated_conv_silu(history, normed, conv_weight, dilation)
        history = np.concatenate([history, normed])[1:]
        outs.append((gated.reshape(1, -1) + conv).astype(np.float32).reshape(hc, n))
    return np.array(outs), history


def gate_scores(streams: np.ndarray, key: np.ndarray, norm_key: np.ndarray, norm_query: np.ndarray) -> np.ndarray:
    """The reference's score [steps, hc] of each token and stream, before the signed square root."""
    steps, hc, n = streams.shape
    k = grouped_rms_norm(key, norm_key, hc, EPS).reshape(steps, hc, n)
    q = grouped_rms_norm(streams.reshape(steps, -1), norm_query, hc, EPS).reshape(steps, hc, n)
    return np.sum(k * q, axis=-1) / np.sqrt(n)


def ple_case(steps: int, hc: int, n: int, dilation: int, kernel: int, rng: np.random.Generator, fresh: bool):
    """Random inputs of `steps` tokens; the history is that of a sequence's first token (zeros) when `fresh`.

    Keys whose score lies within 0.1 of 0 are drawn again: the signed square root's slope 1 / (2 sqrt|s|)
    magnifies the float32 score's rounding past RTOL within ~1e-4 of 0, where one test in a few dozen of 148
    gates would otherwise draw one.
    """
    f = np.float32
    streams = (rng.standard_normal((steps, hc, n)) * rng.uniform(0.5, 4, (steps, hc, 1))).astype(f)
    norms = [rng.uniform(0.5, 1.5, hc * n).astype(f) for _ in range(3)]
    key = rng.standard_normal((steps, hc, n), dtype=f)
    while np.any(near := np.abs(gate_scores(streams, key.reshape(steps, -1), norms[0], norms[1])) < 0.1):
        key[near] = rng.standard_normal((np.count_nonzero(near), n), dtype=f)
    value = (rng.standard_normal((steps, n)) * rng.uniform(0.5, 4, (steps, 1))).astype(f)
    conv_weight = rng.standard_normal((hc * n, kernel), dtype=f) * 0.5
    rows = dilation * (kernel - 1)
    history = np.zeros((rows, hc * n), f) if fresh else rng.standard_normal((rows, hc * n), dtype=f)
    return streams, key.reshape(steps, hc * n), value, norms, conv_weight, history


# (steps, hc, n, dilation, K): qwen4exp's shape (history 9) for one token, fewer tokens than the history, as
# many, no multiple of anything and a few hundred; a width no multiple of the 256 threads; K = 8 (the most)
# with dilation 1; one stream.
CHUNKS = [(1, 4, 2560, 3, 4), (2, 4, 2560, 3, 4), (9, 4, 2560, 3, 4), (37, 4, 2560, 3, 4), (300, 4, 2560, 3, 4),
          (21, 4, 100, 3, 4), (40, 2, 300, 1, 8), (13, 1, 33, 2, 2)]


@pytest.mark.gpu
@pytest.mark.parametrize(("steps", "hc", "n", "dilation", "kernel"), CHUNKS)
@pytest.mark.parametrize("fresh", [True, False], ids=["first-token", "mid-sequence"])
def test_ple_chunk_is_ple_step_per_token(rng, steps, hc, n, dilation, kernel, fresh):
    from strata import _native_check

    streams, key, value, norms, conv_weight, history = ple_case(steps, hc, n, dilation, kernel, rng, fresh)
    args = (streams, key, value, *norms, conv_weight, history)
    got, got_history = _native_check.ple_steps(*args, dilation=dilation, eps=EPS, chunk=True)
    want, want_history = _native_check.ple_steps(*args, dilation=dilation, eps=EPS)
    assert np.all(np.isfinite(got)) and np.all(np.isfinite(got_history)), "non-finite chunk output or history"
    # The chunk recomputes each earlier token's gate with ple_step's own code and sums the taps in its order.
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (
        f"addends: {np.count_nonzero(got.view(np.uint32) != want.view(np.uint32))} elements differ")
    assert np.array_equal(got_history.view(np.uint32), want_history.view(np.uint32)), (
        f"history: {np.count_nonzero(got_history.view(np.uint32) != want_history.view(np.uint32))} elements differ")


@pytest.mark.gpu
@pytest.mark.parametrize(("steps", "hc", "n", "dilation", "kernel"), [(1, 4, 2560, 3, 4), (5, 4, 2560, 3, 4),
                                                                    (8, 2, 300, 1, 8), (3, 1, 33, 2, 2)])
def test_ple_chunk_row_states_are_each_tokens_history(rng, steps, hc, n, dilation, kernel):
    """A verification step's row states (docs/speculative.md): row t is the history t + 1 steps leave, bit for
    bit, and keeping them changes nothing else."""
    from strata import _native_check

    streams, key, value, norms, conv_weight, history = ple_case(steps, hc, n, dilation, kernel, rng, False)
    args = (streams, key, value, *norms, conv_weight, history)
    got, got_history, rows = _native_check.ple_steps(*args, dilation=dilation, eps=EPS, chunk=True, row_states=True)
    want, want_history = _native_check.ple_steps(*args, dilation=dilation, eps=EPS, chunk=True)
    assert_same_bits(got, want, "addends with row states")
    assert_same_bits(got_history, want_history, "history with row states")
    for t in range(steps):
        _, stepped = _native_check.ple_steps(streams[:t + 1], key[:t + 1], value[:t + 1], *norms, conv_weight,
                                             history, dilation=dilation, eps=EPS)
        assert_same_bits(rows[t], stepped, f"history row {t}")


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [False, True], ids=["ple_step", "ple_chunk"])
@pytest.mark.parametrize("fresh", [True, False], ids=["first-token", "mid-sequence"])
def test_ple_matches_reference(rng, chunk, fresh):
    from strata import _native_check

    steps, hc, n, dilation, kernel = 37, 4, 2560, 3, 4
    streams, key, value, norms, conv_weight, history = ple_case(steps, hc, n, dilation, kernel, rng, fresh)
    got, got_history = _native_check.ple_steps(streams, key, value, *norms, conv_weight, history,
                                               dilation=dilation, eps=EPS, chunk=chunk)
    want, want_history = reference_steps(streams, key, value, *norms, conv_weight, history, dilation)
    assert np.all(np.isfinite(got))
    for t in range(steps):
        err = np.max(np.abs(got[t] - want[t])) / np.max(np.abs(want[t]))
        assert err < RTOL, f"step {t}: relative error {err:.2e}"
    err = np.max(np.abs(got_history - want_history)) / np.max(np.abs(want_history))
    assert err < RTOL, f"history relative error {err:.2e}"
