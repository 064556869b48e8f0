"""The MTP (next-token-prediction) block of qwen3next and qwen35moe, and the drafter that chains it.

The block reads the main model's hidden state h_i at position i (after the final norm: the rows the LM head
reads) and the token t_{i+1} that follows it, and predicts t_{i+2} (docs/speculative.md, "MTP drafts"):

    e = enorm(embed(t_{i+1}));  h = hnorm(h_i);  u = eh_proj [e | h]
    u = one full-attention decoder layer with the model's MoE (its own KV cache, at position i)
    out = shared_head_norm(u);  logits = lm_head(out)

`out` is also the hidden state the next draft reads (with the draft it just made), as vLLM and llama.cpp chain it.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

from strata import models
from strata.errors import FormatError, InvalidArgument
from strata.format.inventory_check import squeeze, with_alternatives
from strata.options import KV
from strata.reference.attention import AttentionShape, KvState, gated_attention
from strata.reference.model import Reference
from strata.reference.moe import moe_forward
from strata.reference.ops import rms_norm, rope_tables
from strata.reference.weights import Weights


def check_block(geometry: models.Geometry, weights: Weights) -> None:
    """FormatError unless `weights` hold a well-formed MTP block of `geometry`, naming the tensor at fault."""
    inventory, alternatives = models.mtp_inventory(geometry), models.mtp_alternatives(geometry)
    optional = models.mtp_optional(geometry)
    named = [s.name for s in (*inventory, *optional)] + [alt.spec.name for alt in alternatives]
    held = {name for name in named if weights.has(name)}
    specs = with_alternatives(inventory, alternatives, held)
    specs.update((s.name, s) for s in optional if s.name in held)
    for name, spec in specs.items():
        if not weights.has(name):
            raise FormatError(f"{geometry.arch} MTP block: tensor {name!r} (ne {spec.ne}) is missing")
        if squeeze(weights.ne(name)) != squeeze(spec.ne):
            raise FormatError(f"{geometry.arch} MTP block: tensor {name!r}: expected ne {spec.ne}, "
                              f"found {weights.ne(name)}")


class MtpBlock:
    """The first MTP block of a model (block n_layer), stateless: each call reads and extends a KvState."""

    def __init__(self, geometry: models.Geometry, weights: Weights, kv: KV | str | None = None):
        check_block(geometry, weights)
        self.geometry, self.weights, self.kv = geometry, weights, kv
        self.layer = geometry.n_layer
        self._shape = AttentionShape(geometry.n_head, geometry.n_head_kv, geometry.head_dim)
        p, w = f"blk.{self.layer}.nextn.", weights
        self._embedding = p + "embed_tokens.weight" if w.has(p + "embed_tokens.weight") else "token_embd.weight"
        self._head = next(name for name in (p + "shared_head_head.weight", "output.weight", "token_embd.weight")
                          if w.has(name))

    def new_cache(self) -> KvState:
        return KvState(self._shape, self.kv)

    def forward(self, cache: KvState, hidden: np.ndarray, next_ids: Sequence[int] | np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
        """Rows (hidden[j], next_ids[j]) at the positions after `cache`'s, which it appends to: (logits
        [T, n_vocab], out [T, n_embd]), float32; out is the hidden state a chained draft reads."""
        g, w, b = self.geometry, self.weights, f"blk.{self.layer}."
        ids = np.asarray(next_ids, dtype=np.int64).reshape(-1)
        positions = cache.k.shape[1] + np.arange(ids.size)
        cos, sin = rope_tables(positions, g.rope_dim, g.rope_theta)
        e = rms_norm(w.rows(self._embedding, ids), w.get(b + "nextn.enorm.weight"), g.rms_eps)
        h = rms_norm(hidden, w.get(b + "nextn.hnorm.weight"), g.rms_eps)
        u = w.matmul(b + "nextn.eh_proj.weight", np.concatenate([e, h], axis=-1).astype(np.float32))
        x = rms_norm(u, w.get(b + "attn_norm.weight"), g.rms_eps).astype(np.float32)
        u = (u + gated_attention(w, self.layer, x, cache, self._shape, cos, sin, g.rms_eps)).astype(np.float32)
        x = rms_norm(u, w.get(b + "post_attention_norm.weight"), g.rms_eps).astype(np.float32)
        u = (u + moe_forward(w, self.layer, x, g.n_expert_used, g.expert_ff)[0]).astype(np.float32)
        out = rms_norm(u, w.get(b + "nextn.shared_head_norm.weight"), g.rms_eps).astype(np.float32)
        return w.matmul(self._head, out), out


class MtpReference:
    """A Reference whose MTP block keeps step with it, for ReferenceEngine: every token fed after the first
    also runs the block on (the hidden state before it, it), so the block's cache holds row i for position i.
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
    def state(self) -> tuple[Any, KvState, np.ndarray | None]:
        """(the main model's state, the block's cache, the hidden state of the last token fed)."""
        return self.main.state, self._cache, self._pending

    @state.setter
    def state(self, value: tuple[Any, KvState, np.ndarray | None]) -> None:
        self.main.state, self._cache, self._pending = value

    def reset(self) -> None:
        self.main.reset()
        self._cache, self._pending = self.block.new_cache(), None

    def forward(self, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """The main model's logits for `token_ids` (Reference.forward); the block runs on each token's pair."""
        logits = self.main.forward(token_ids)
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        hidden = self.main.last_hidden
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
        cache, hidden, drafts = copy.copy(self._cache), self._pending[None], []
        for _ in range(k):  # a KvState's append makes new arrays, so the shallow copy keeps self._cache's
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
