"""The MTP (next-token-prediction) block of qwen4exp, qwen3next and qwen35moe, and the drafter that chains it.

The block reads the main model's state at position i and the token t_{i+1} that follows it, and predicts t_{i+2}
(docs/speculative.md, "MTP drafts"; qwen4exp: docs/models/qwen4exp.md §7).

qwen3next / qwen35moe read h_i, the main model's hidden state after the final norm (the rows the LM head reads):

    e = enorm(embed(t_{i+1}));  h = hnorm(h_i);  u = eh_proj [e | h]
    u = one full-attention decoder layer with the model's MoE (its own KV cache, at position i)
    out = shared_head_norm(u);  logits = lm_head(out)

qwen4exp reads H_i, the main model's residual streams after its last layer (before the final mixer):

    e = enorm(embed(t_{i+1}));  h = hnorm(H_i) (one RMS over every stream);  U_k = eh_proj [e | h_k] per stream
    U = one decoder layer as the main model's attention layers: HC mixers, QSA attention (its own KV and indexer
        caches, at position i), the model's MoE
    out = U;  logits = lm_head(mixer(U, nextn.hc_head_*))

`out` is also the state the next draft reads (with the draft it just made), as vLLM and llama.cpp chain it.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from strata import models
from strata.errors import InvalidArgument
from strata.format.inventory_check import check_mtp_block
from strata.options import KV
from strata.reference.attention import AttentionShape, KvState, gated_attention
from strata.reference.hc import hc_read, hc_write
from strata.reference.model import Reference
from strata.reference.moe import moe_forward
from strata.reference.ops import rms_norm, rope_tables
from strata.reference.qsa import IndexerShape, IndexerState, qsa_select
from strata.reference.weights import Weights


def check_block(geometry: models.Geometry, weights: Weights) -> None:
    """FormatError unless `weights` hold a well-formed MTP block of `geometry`, naming the tensor at fault."""
    check_mtp_block(geometry, lambda name: weights.ne(name) if weights.has(name) else None)


@dataclass
class MtpCache:
    """The block's own caches, row i for position i: its attention K/V and, where the block has a QSA indexer
    (qwen4exp), its raw indexer keys."""

    kv: KvState
    indexer: IndexerState | None = None

    @property
    def rows(self) -> int:
        return self.kv.k.shape[1]

    def copy(self) -> MtpCache:
        """A cache to draft on: appends make new arrays, so shallow copies leave this one as it is."""
        return MtpCache(copy.copy(self.kv), copy.copy(self.indexer))


class MtpBlock:
    """The first MTP block of a model (block n_layer), stateless: each call reads and extends an MtpCache."""

    def __init__(self, geometry: models.Geometry, weights: Weights, kv: KV | str | None = None):
        check_block(geometry, weights)
        g = geometry
        self.geometry, self.weights, self.kv = g, weights, kv
        self.layer = g.n_layer
        self.streams = g.has_hyper_connections
        self._shape = AttentionShape(g.n_head, g.n_head_kv, g.head_dim)
        self._indexer = None
        p, w = f"blk.{self.layer}.", weights
        if self.streams and w.has(p + "indexer.q_proj.weight"):
            self._indexer = IndexerShape(g.indexer_n_heads, g.indexer_head_dim, g.qsa_ratio(self.layer),
                                         g.indexer_top_k, g.rope_dim, g.rope_theta)
        own = p + "nextn.embed_tokens.weight"
        self._embedding = own if w.has(own) else "token_embd.weight"
        self._head = next(name for name in (p + "nextn.shared_head_head.weight", "output.weight", "token_embd.weight")
                          if w.has(name))

    @property
    def width(self) -> int:
        """Width of the state the block reads and passes on: every residual stream (qwen4exp), else n_embd."""
        return self.geometry.hc_width

    def state_of(self, main: Reference) -> np.ndarray:
        """The rows of the main model's last forward that the block reads: [T, width]."""
        state = main.last_streams if self.streams else main.last_hidden
        if state is None:
            raise InvalidArgument("the main model has run no token: the MTP block has no state to read")
        return state

    def new_cache(self) -> MtpCache:
        return MtpCache(KvState(self._shape, self.kv), IndexerState(self._indexer) if self._indexer else None)

    def forward(self, cache: MtpCache, hidden: np.ndarray, next_ids: Sequence[int] | np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
        """Rows (hidden[j], next_ids[j]) at the positions after `cache`'s, which it appends to: (logits
        [T, n_vocab], out [T, width]), float32; out is the state a chained draft reads."""
        g, w, b = self.geometry, self.weights, f"blk.{self.layer}."
        ids = np.asarray(next_ids, dtype=np.int64).reshape(-1)
        hidden = np.asarray(hidden, dtype=np.float32).reshape(ids.size, self.width)
        positions = cache.rows + np.arange(ids.size)
        cos, sin = rope_tables(positions, g.rope_dim, g.rope_theta)
        e = rms_norm(w.rows(self._embedding, ids), w.get(b + "nextn.enorm.weight"), g.rms_eps)
        h = rms_norm(hidden, w.get(b + "nextn.hnorm.weight"), g.rms_eps)
        if self.streams:
            return self._streams_forward(cache, e, h, positions, cos, sin)
        u = w.matmul(b + "nextn.eh_proj.weight", np.concatenate([e, h], axis=-1).astype(np.float32))
        x = rms_norm(u, w.get(b + "attn_norm.weight"), g.rms_eps).astype(np.float32)
        u = (u + gated_attention(w, self.layer, x, cache.kv, self._shape, cos, sin, g.rms_eps)).astype(np.float32)
        x = rms_norm(u, w.get(b + "post_attention_norm.weight"), g.rms_eps).astype(np.float32)
        u = (u + moe_forward(w, self.layer, x, g.n_expert_used, g.expert_ff)[0]).astype(np.float32)
        out = rms_norm(u, w.get(b + "nextn.shared_head_norm.weight"), g.rms_eps).astype(np.float32)
        return w.matmul(self._head, out), out

    def _streams_forward(self, cache: MtpCache, e: np.ndarray, h: np.ndarray, positions: np.ndarray,
                         cos: np.ndarray, sin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """qwen4exp: e [T, n] and the normed streams h [T, hc * n] -> (logits, the streams after the block)."""
        g, w, b = self.geometry, self.weights, f"blk.{self.layer}."
        t, hc, n = e.shape[0], g.hc_count, g.n_embd
        # eh_proj [e | h_k] on each stream k: fc_embedding e + fc_hidden h_k
        pairs = np.concatenate([np.broadcast_to(e[:, None, :], (t, hc, n)), h.reshape(t, hc, n)], axis=-1)
        u = w.matmul(b + "nextn.eh_proj.weight", pairs.reshape(t * hc, 2 * n).astype(np.float32)).reshape(t, hc, n)
        x, inj = hc_read(w, b + "hc_attn", u, g.rms_eps)
        selected = None
        if cache.indexer is not None:
            selected = qsa_select(w, self.layer, x, positions, cache.indexer, self._indexer, cos, sin, g.rms_eps)[0]
        u = hc_write(u, inj, gated_attention(w, self.layer, x, cache.kv, self._shape, cos, sin, g.rms_eps, selected))
        x, inj = hc_read(w, b + "hc_ffn", u, g.rms_eps)
        u = hc_write(u, inj, moe_forward(w, self.layer, x, g.n_expert_used, g.expert_ff)[0])
        x, _ = hc_read(w, b + "nextn.hc_head", u, g.rms_eps, inject=False)
        return w.matmul(self._head, x), u.reshape(t, hc * n)


class MtpReference:
    """A Reference whose MTP block keeps step with it, for ReferenceEngine: every token fed after the first
    also runs the block on (the state before it, it), so the block's cache holds row i for position i.
    `state` is the main model's and the block's together (the engine's snapshots, verify rows and truncate
    keep both); `draft` chains the block from the last token fed without changing either."""

    def __init__(self, main: Reference, kv: KV | str | None = None):
        g = main.geometry
        if not g.n_mtp:
            raise InvalidArgument(f"draft 'mtp': this {g.arch} file has no MTP block ({g.arch}.nextn_predict_layers "
                                  "is absent or 0); use draft='lookup'")
        if g.arch not in models.MTP_ARCHITECTURES:
            raise InvalidArgument(f"draft 'mtp': the MTP block of {g.arch} is not supported (one of "
                                  f"{', '.join(models.MTP_ARCHITECTURES)}); use draft='lookup'")
        self.main, self.geometry = main, g
        self.block = MtpBlock(main.geometry, main.weights, kv)
        self._cache, self._pending = self.block.new_cache(), None

    @property
    def n_past(self) -> int:
        return self.main.n_past

    @n_past.setter
    def n_past(self, value: int) -> None:
        self.main.n_past = value

    @property
    def state(self) -> tuple[Any, MtpCache, np.ndarray | None]:
        """(the main model's state, the block's cache, the block's input state of the last token fed)."""
        return self.main.state, self._cache, self._pending

    @state.setter
    def state(self, value: tuple[Any, MtpCache, np.ndarray | None]) -> None:
        self.main.state, self._cache, self._pending = value

    def reset(self) -> None:
        self.main.reset()
        self._cache, self._pending = self.block.new_cache(), None

    def forward(self, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """The main model's logits for `token_ids` (Reference.forward); the block runs on each token's pair."""
        logits = self.main.forward(token_ids)
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        hidden = self.block.state_of(self.main)
        if self._pending is not None:
            self.block.forward(self._cache, np.concatenate([self._pending[None], hidden[:-1]]), ids)
        elif ids.size > 1:
            self.block.forward(self._cache, hidden[:-1], ids[1:])
        self._pending = hidden[-1]
        return logits

    def draft(self, token: int, k: int) -> list[int]:
        """k greedy drafts to follow `token` (the one after the last token fed): draft j + 1 from the block's
        output for draft j. Nothing is proposed before a token was fed; the block's cache is left as it was."""
        if self._pending is None or k < 1:
            return []
        cache, hidden, drafts = self._cache.copy(), self._pending[None], []
        for _ in range(k):
            logits, hidden = self.block.forward(cache, hidden, [token])
            token = int(np.argmax(logits[0]))
            drafts.append(token)
        return drafts


class MtpDrafter:
    """A Drafter (strata.generation.drafts) over an MtpReference's block: k greedy drafts after the pending
    token, where the sequence is the one the reference has fed (else none)."""

    def __init__(self, reference: MtpReference):
        self.reference = reference

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        if len(history) != self.reference.n_past + 1:
            return []
        return self.reference.draft(int(history[-1]), k)
