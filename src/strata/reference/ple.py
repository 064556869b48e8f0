"""PLE block of qwen4exp (docs/models/qwen4exp.md §3(d)): hashed n-gram embeddings, a per-stream
sigmoid gate and a dilated depthwise conv, added to every stream before that layer's attention mixer."""

from __future__ import annotations

import numpy as np

from strata.models import PleShape
from strata.reference.ops import grouped_rms_norm, sigmoid, silu
from strata.reference.weights import Weights


class PleState:
    """The last ngram-1 token ids (EOS before the sequence) and the conv history rows [history, hc*n]."""

    def __init__(self, shape: PleShape, width: int):
        self.ids = np.full(shape.ngram - 1, shape.eos, dtype=np.int64)
        self.conv = np.zeros((shape.history, width), dtype=np.float32)


def ngram_context(previous: np.ndarray, ids: np.ndarray, eos: int) -> np.ndarray:
    """Context c[t, s] = token s places before ids[t] (s = 0..len(previous)), EOS-cut.

    `previous` holds the ids right before the chunk, oldest first. A predecessor at or beyond the nearest
    EOS predecessor (s >= 1) reads as EOS; a token's own EOS does not cut anything.
    """
    span = len(previous)
    history = np.concatenate([np.asarray(previous, dtype=np.int64), np.asarray(ids, dtype=np.int64)])
    ctx = np.empty((len(ids), span + 1), dtype=np.int64)
    for t in range(len(ids)):
        p = span + t
        ctx[t, 0] = history[p]
        cut = False
        for s in range(1, span + 1):
            cut = cut or history[p - s] == eos
            ctx[t, s] = eos if cut else history[p - s]
    return ctx


def ngram_rows(ctx: np.ndarray, shape: PleShape) -> np.ndarray:
    """Table rows [T, (ngram-1)*heads_per_ngram]: order k = 2..ngram hashes c0..c_{k-1} (uint64 XOR of c_s*m_s)."""
    # The runtime runs this hash once, natively (strata::PleNgrams); this numpy copy stays on purpose: the oracle
    # the native hash is checked against (tests/session/test_ple_gather.py) must not be the code under test.
    prod = ctx.astype(np.uint64) * np.asarray(shape.multipliers, dtype=np.uint64)[None, :]  # wraps mod 2^64
    sizes = np.asarray(shape.head_sizes, dtype=np.uint64)
    offsets = np.asarray(shape.head_offsets, dtype=np.uint64)
    mixed = prod[:, 0]
    cols = []
    for order in range(2, shape.ngram + 1):
        mixed = mixed ^ prod[:, order - 1]
        heads = slice((order - 2) * shape.heads_per_ngram, (order - 1) * shape.heads_per_ngram)
        cols.append(mixed[:, None] % sizes[None, heads] + offsets[None, heads])
    return np.concatenate(cols, axis=1).astype(np.int64)


def dilated_conv_silu(history: np.ndarray, rows: np.ndarray, kernel: np.ndarray, dilation: int) -> np.ndarray:
    """silu(sum_j kernel[:, j] * row[t - dilation*(K-1-j)]) over [history | rows]; kernel [C, K]."""
    window = np.concatenate([history, rows]).astype(np.float64)
    k = kernel.shape[1]
    lead = history.shape[0]
    out = np.zeros(rows.shape, dtype=np.float64)
    for j in range(k):
        start = lead - dilation * (k - 1 - j)
        out += window[start:start + rows.shape[0]] * kernel[:, j].astype(np.float64)
    return silu(out)


def ple_forward(weights: Weights, layer: int, streams: np.ndarray, ids: np.ndarray, state: PleState,
                shape: PleShape, eps: float) -> np.ndarray:
    """The PLE addend [T, hc, n] float32 for streams [T, hc, n] and chunk token ids; updates `state`."""
    b = f"blk.{layer}."
    t, hc, n = streams.shape
    ctx = ngram_context(state.ids, ids, shape.eos)
    state.ids = np.concatenate([state.ids, np.asarray(ids, dtype=np.int64)])[-(shape.ngram - 1):]
    rows = ngram_rows(ctx, shape)
    emb = weights.rows("per_layer_token_embd.weight", rows.reshape(-1)).reshape(t, -1)

    key = grouped_rms_norm(weights.matmul(b + "ple_key.weight", emb), weights.get(b + "ple_norm_key.weight"),
                           hc, eps).reshape(t, hc, n)
    value = weights.matmul(b + "ple_value.weight", emb).astype(np.float64)
    query = grouped_rms_norm(streams.reshape(t, hc * n), weights.get(b + "ple_norm_query.weight"),
                             hc, eps).reshape(t, hc, n)
    score = np.sum(key * query, axis=-1) / np.sqrt(n)
    score = np.sign(score) * np.sqrt(np.maximum(np.abs(score), 1e-6))
    gated = (sigmoid(score)[:, :, None] * value[:, None, :]).astype(np.float32)
    normed = grouped_rms_norm(gated.reshape(t, hc * n), weights.get(b + "ple_norm_conv.weight"),
                              hc, eps).astype(np.float32)
    conv = dilated_conv_silu(state.conv, normed, weights.get(b + "ple_conv1d.weight"), shape.ngram)
    state.conv = np.concatenate([state.conv, normed])[-shape.history:]
    return (gated.reshape(t, hc * n) + conv).astype(np.float32).reshape(t, hc, n)
