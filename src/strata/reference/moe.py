"""Sparse MoE with a sigmoid-gated shared expert (docs/models/qwen3next.md §3.3; qwen4exp §3(e))."""

from __future__ import annotations

import numpy as np

from strata.reference.ops import sigmoid, silu
from strata.reference.weights import Weights


def route(logits: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Softmax over all experts, top-k (exact ties go to the lower expert index), renormalised.

    logits [T, E] -> (ids [T, k] int64 in descending probability, weights [T, k] float32 summing to 1).
    """
    z = np.asarray(logits, dtype=np.float64)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :top_k]  # stable: equal values keep index order
    top = np.take_along_axis(p, ids, axis=-1)
    return ids.astype(np.int64), (top / top.sum(axis=-1, keepdims=True)).astype(np.float32)


def _swiglu(weights: Weights, gate: str, up: str, down: str, x: np.ndarray, expert: int | None = None,
            gate_rows: int | None = None) -> np.ndarray:
    """down(silu(gate x) * up x); with `gate_rows`, gate and up are halves of one merged tensor `gate`."""
    if gate_rows is None:
        g = weights.matmul(gate, x, expert)
        u = weights.matmul(up, x, expert)
    else:
        gu = weights.matmul(gate, x, expert)
        g, u = gu[:, :gate_rows], gu[:, gate_rows:]
    h = (silu(g) * u).astype(np.float32)
    return weights.matmul(down, h, expert)


def moe_forward(weights: Weights, layer: int, x: np.ndarray, top_k: int, expert_ff: int,
                defer: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """MoE block of `layer` on x [T, n]: (out [T, n] float32, router ids [T, k], router weights [T, k],
    deferred [T, n] float32). The `defer` routed experts of lowest weight (the last ids) are left out of `out`
    and summed, with their own weights, into `deferred` (expert deferral, docs/session.md)."""
    b = f"blk.{layer}."
    ids, w = route(weights.matmul(b + "ffn_gate_inp.weight", x), top_k)
    merged = weights.has(b + "ffn_gate_up_exps.weight")
    out = np.zeros(x.shape, dtype=np.float64)
    deferred = np.zeros(x.shape, dtype=np.float64)
    for t in range(x.shape[0]):
        xt = x[t:t + 1]
        for j in range(top_k):
            e = int(ids[t, j])
            if merged:
                y = _swiglu(weights, b + "ffn_gate_up_exps.weight", "", b + "ffn_down_exps.weight", xt, e,
                            gate_rows=expert_ff)
            else:
                y = _swiglu(weights, b + "ffn_gate_exps.weight", b + "ffn_up_exps.weight",
                            b + "ffn_down_exps.weight", xt, e)
            (deferred if j >= top_k - defer else out)[t] += float(w[t, j]) * y[0]
    shared = _swiglu(weights, b + "ffn_gate_shexp.weight", b + "ffn_up_shexp.weight", b + "ffn_down_shexp.weight", x)
    shared_gate = sigmoid(weights.matmul(b + "ffn_gate_inp_shexp.weight", x)[:, 0])
    out += shared_gate[:, None] * shared
    return out.astype(np.float32), ids, w, deferred.astype(np.float32)
