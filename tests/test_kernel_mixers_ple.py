"""The PLE block's device half (norms, signed-sqrt gate, dilated conv + history) vs strata.reference.ple."""

import numpy as np
import pytest

from strata.reference.ops import grouped_rms_norm, sigmoid
from strata.reference.ple import dilated_conv_silu

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


@pytest.mark.gpu
def test_ple_steps_match_reference(rng):
    from strata import _native_check

    steps, hc, n, dilation, kernel = 5, 4, 2560, 3, 4
    f = np.float32
    streams = rng.standard_normal((steps, hc, n), dtype=f)
    key = rng.standard_normal((steps, hc * n), dtype=f)
    value = rng.standard_normal((steps, n), dtype=f)
    norms = [rng.uniform(0.5, 1.5, hc * n).astype(f) for _ in range(3)]
    conv_weight = rng.standard_normal((hc * n, kernel), dtype=f) * 0.5
    history = rng.standard_normal((dilation * (kernel - 1), hc * n), dtype=f)
    got, got_history = _native_check.ple_steps(streams, key, value, *norms, conv_weight, history, dilation=dilation,
                                               eps=EPS)
    want, want_history = reference_steps(streams, key, value, *norms, conv_weight, history, dilation)
    assert np.all(np.isfinite(got))
    for t in range(steps):
        err = np.max(np.abs(got[t] - want[t])) / np.max(np.abs(want[t]))
        assert err < RTOL, f"step {t}: relative error {err:.2e}"
    err = np.max(np.abs(got_history - want_history)) / np.max(np.abs(want_history))
    assert err < RTOL, f"history relative error {err:.2e}"
