"""QSA indexer of qwen4exp attention layers (docs/models/qwen4exp.md §3(c), transformers' QSAIndexer).

The indexer caches raw per-token keys. For a query at position p it sees n = p + 1 tokens, pools each
complete block of `ratio` tokens (mean, RMSNorm, RoPE at the block's first position), scores the blocks by
sum over heads of relu(q_h . k_b) / sqrt(d), keeps the top min(budget / ratio, nb) blocks and always the open
tail block 4*nb .. p. Exact score ties go to the lower block index.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.reference.ops import apply_rope, rms_norm, rope_tables
from strata.reference.weights import Weights


@dataclass(frozen=True)
class IndexerShape:
    n_heads: int
    head_dim: int
    ratio: int        # tokens per compressed block
    budget: int       # tokens from complete blocks: budget // ratio blocks
    rope_dim: int
    rope_theta: float


class IndexerState:
    """Per-layer raw indexer keys, float32 [tokens, head_dim] (not normed, not roped)."""

    def __init__(self, shape: IndexerShape):
        self.raw_keys = np.zeros((0, shape.head_dim), dtype=np.float32)


def pooled_block_keys(raw_keys: np.ndarray, n_blocks: int, shape: IndexerShape, k_norm: np.ndarray,
                      eps: float) -> np.ndarray:
    """Keys of blocks 0..n_blocks-1: mean of their raw keys, normed, roped at position ratio*b. [nb, d] float32."""
    r = shape.ratio
    pooled = raw_keys[:n_blocks * r].astype(np.float64).reshape(n_blocks, r, raw_keys.shape[1]).mean(axis=1)
    normed = rms_norm(pooled.astype(np.float32), k_norm, eps)
    cos, sin = rope_tables(np.arange(n_blocks) * r, shape.rope_dim, shape.rope_theta)
    return apply_rope(normed[:, None, :], cos, sin)[:, 0].astype(np.float32)


def block_scores(q: np.ndarray, block_keys: np.ndarray) -> np.ndarray:
    """sum_h relu(q_h . k_b) / sqrt(d) for q [H, d], block_keys [nb, d] -> [nb] float64."""
    dots = q.astype(np.float64) @ block_keys.astype(np.float64).T
    return np.maximum(dots, 0.0).sum(axis=0) / np.sqrt(q.shape[-1])


def select_blocks(scores: np.ndarray, keep: int) -> np.ndarray:
    """Indices of the `keep` best blocks, sorted ascending; equal scores prefer the lower index."""
    order = np.argsort(-scores, kind="stable")
    return np.sort(order[:keep])


def qsa_select(weights: Weights, layer: int, x: np.ndarray, positions: np.ndarray, state: IndexerState,
               shape: IndexerShape, cos: np.ndarray, sin: np.ndarray,
               eps: float) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """Index x [T, n] at `positions`; appends raw keys to `state`.

    Returns (selected [T, P] bool over every cached token, chosen block indices per row, block scores per row).
    """
    b = f"blk.{layer}."
    t = x.shape[0]
    q = weights.matmul(b + "indexer.q_proj.weight", x).reshape(t, shape.n_heads, shape.head_dim)
    q = apply_rope(rms_norm(q, weights.get(b + "indexer.q_norm.weight"), eps), cos, sin).astype(np.float32)
    state.raw_keys = np.concatenate([state.raw_keys, weights.matmul(b + "indexer.k_proj.weight", x)])

    total = state.raw_keys.shape[0]
    visible = positions.astype(np.int64) + 1
    max_blocks = int(visible.max()) // shape.ratio
    keys = pooled_block_keys(state.raw_keys, max_blocks, shape, weights.get(b + "indexer.k_norm.weight"), eps)
    selected = np.zeros((t, total), dtype=bool)
    chosen: list[np.ndarray] = []
    all_scores: list[np.ndarray] = []
    for i in range(t):
        nb = int(visible[i]) // shape.ratio
        scores = block_scores(q[i], keys[:nb])
        blocks = select_blocks(scores, min(shape.budget // shape.ratio, nb))
        for blk in blocks:
            selected[i, blk * shape.ratio:(blk + 1) * shape.ratio] = True
        selected[i, nb * shape.ratio:int(visible[i])] = True
        chosen.append(blocks)
        all_scores.append(scores)
    return selected, chosen, all_scores
