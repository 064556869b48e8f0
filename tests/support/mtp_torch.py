"""MTP blocks in torch, float64, written from the equations (docs/speculative.md, "MTP drafts"; qwen4exp:
docs/models/qwen4exp.md §7) independently of strata.reference: the oracles the reference's block is held to.

TorchMtp: qwen3next / qwen35moe (vLLM's qwen3_next_mtp.py, llama.cpp's qwen35moe graph_mtp). TorchHcMtp: qwen4exp
(vLLM's Qwen4ExpMultiTokenPredictor): the block reads and passes on every residual stream, mixes them through
hyper-connection mixers, attends through its own QSA indexer and reads out through its own mixer.

Weights are GGUF-named float arrays (numpy shape = reversed ggml ne, so a matrix is [out, in]); norms are the
stored gammas (the converter's 1 + w). Each block keeps its own rows, one per position, and a row is computed
alone, token by token.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch


class _TorchLayer:
    """What both blocks share: weights by GGUF name, RMSNorm, rotate-half RoPE, gated attention over the kept
    rows, the MoE with its gated shared expert."""

    def __init__(self, tensor: Callable[[str], np.ndarray], has: Callable[[str], bool], *, layer: int, n_head: int,
                 n_head_kv: int, head_dim: int, rope_dim: int, rope_theta: float, eps: float, top_k: int):
        self.t = lambda name: torch.from_numpy(np.asarray(tensor(name), dtype=np.float64))
        self.b, self.has = f"blk.{layer}.", has
        self.n_head, self.n_head_kv, self.head_dim = n_head, n_head_kv, head_dim
        self.rope_dim, self.rope_theta, self.eps, self.top_k = rope_dim, rope_theta, eps, top_k
        self.keys: list[torch.Tensor] = []     # one [n_head_kv, head_dim] per position
        self.values: list[torch.Tensor] = []

    def norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.t(name)

    def rope(self, x: torch.Tensor, position: int) -> torch.Tensor:
        """Rotate-half RoPE on the first rope_dim dims of each head of x [heads, dims]."""
        half = self.rope_dim // 2
        freq = self.rope_theta ** (-torch.arange(half, dtype=torch.float64) * 2 / self.rope_dim)
        c, s = torch.cos(position * freq), torch.sin(position * freq)
        a, b = x[:, :half], x[:, half:2 * half]
        return torch.cat([a * c - b * s, b * c + a * s, x[:, 2 * half:]], dim=-1)

    def visible(self, x: torch.Tensor, position: int) -> list[int]:
        """The positions the row at `position` attends to: every one up to it (dense causal attention)."""
        return list(range(position + 1))

    def attention(self, x: torch.Tensor, position: int) -> torch.Tensor:
        b, d = self.b, self.head_dim
        qg = (self.t(b + "attn_q.weight") @ x).view(self.n_head, 2 * d)
        q = self.rope(self.norm(qg[:, :d], b + "attn_q_norm.weight"), position)
        k = self.rope(self.norm((self.t(b + "attn_k.weight") @ x).view(self.n_head_kv, d), b + "attn_k_norm.weight"),
                      position)
        self.keys.append(k)
        self.values.append((self.t(b + "attn_v.weight") @ x).view(self.n_head_kv, d))
        seen = self.visible(x, position)
        keys = torch.stack([self.keys[p] for p in seen], 1)        # [kv heads, seen, d]
        values = torch.stack([self.values[p] for p in seen], 1)
        group = self.n_head // self.n_head_kv
        heads = []
        for h in range(self.n_head):
            weights = torch.softmax(keys[h // group] @ q[h] / d ** 0.5, dim=0)
            heads.append(weights @ values[h // group] * torch.sigmoid(qg[h, d:]))
        return self.t(b + "attn_output.weight") @ torch.cat(heads)

    def moe(self, x: torch.Tensor) -> torch.Tensor:
        b = self.b
        p = torch.softmax(self.t(b + "ffn_gate_inp.weight") @ x, dim=0)
        top = torch.topk(p, self.top_k)
        out = torch.zeros_like(x)
        for weight, e in zip(top.values / top.values.sum(), top.indices):
            out += weight * self.swiglu(x, "exps", e)
        shared_gate = torch.sigmoid(self.t(b + "ffn_gate_inp_shexp.weight").reshape(-1) @ x)
        return out + shared_gate * self.swiglu(x, "shexp")

    def swiglu(self, x: torch.Tensor, kind: str, expert: torch.Tensor | None = None) -> torch.Tensor:
        """down(silu(gate x) * up x) of the shared expert ("shexp") or of routed expert `expert` ("exps")."""
        gate, up, down = (self.t(f"{self.b}ffn_{part}_{kind}.weight") for part in ("gate", "up", "down"))
        if expert is not None:
            gate, up, down = gate[expert], up[expert], down[expert]
        return down @ (torch.nn.functional.silu(gate @ x) * (up @ x))

    def embedding(self, next_id: int) -> torch.Tensor:
        own = self.b + "nextn.embed_tokens.weight"
        return self.t(own if self.has(own) else "token_embd.weight")[next_id]

    def head(self, x: torch.Tensor) -> torch.Tensor:
        names = (self.b + "nextn.shared_head_head.weight", "output.weight", "token_embd.weight")
        return self.t(next(name for name in names if self.has(name))) @ x


class TorchMtp(_TorchLayer):
    """qwen3next / qwen35moe: `step(hidden, next_id)` appends a row at the next position and returns (logits,
    the hidden state a chained draft reads), both float64 tensors."""

    def step(self, hidden: np.ndarray, next_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One row: the main model's (or the last step's) hidden state [n_embd] and the token after it."""
        b = self.b
        e = self.norm(self.embedding(next_id), b + "nextn.enorm.weight")
        h = self.norm(torch.from_numpy(np.asarray(hidden, dtype=np.float64)), b + "nextn.hnorm.weight")
        u = self.t(b + "nextn.eh_proj.weight") @ torch.cat([e, h])
        u = u + self.attention(self.norm(u, b + "attn_norm.weight"), len(self.keys))
        u = u + self.moe(self.norm(u, b + "post_attention_norm.weight"))
        out = self.norm(u, b + "nextn.shared_head_norm.weight")
        return self.head(out), out


class TorchHcMtp(_TorchLayer):
    """qwen4exp: `step(streams, next_id)` appends a row at the next position and returns (logits, the streams a
    chained draft reads [hc * n_embd]), both float64 tensors. `indexer` = (heads, head_dim, block, budget) of the
    block's QSA indexer (transformers' Qwen4ExpTextQSAIndexer semantics, ties to the lower block), or None."""

    def __init__(self, *args, hc: int, indexer: tuple[int, int, int, int] | None, **kwargs):
        super().__init__(*args, **kwargs)
        self.hc, self.indexer = hc, indexer
        self.index_keys: list[torch.Tensor] = []   # raw indexer keys, one [head_dim] per position

    def grouped_norm(self, streams: torch.Tensor, name: str) -> torch.Tensor:
        """streams [hc, n]: each stream RMS-normed on its own, times its slice of the [hc * n] gamma."""
        w = self.t(name).view(self.hc, -1)
        return streams * torch.rsqrt(streams.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def mixer(self, streams: torch.Tensor, prefix: str, inject: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The hyper-connection read of `prefix`: (the block input [n], the per-stream write weights [hc])."""
        normed = self.grouped_norm(streams, prefix + "_norm.weight")
        flat = normed.reshape(-1)
        low = torch.nn.functional.silu(self.t(prefix + "_down.weight") @ flat / self.hc)
        gates = torch.sigmoid(self.t(prefix + "_up.weight") @ low).view(self.hc, -1)
        x = (gates * normed).mean(0)
        if not inject:
            return x, None
        return x, 2 * torch.sigmoid(self.t(prefix + "_inject.weight") @ flat / self.hc)

    def visible(self, x: torch.Tensor, position: int) -> list[int]:
        """QSA: the top budget / block blocks of `block` tokens by indexer score, and the open tail block."""
        if self.indexer is None:
            return super().visible(x, position)
        heads, dim, block, budget = self.indexer
        b = self.b
        q = (self.t(b + "indexer.q_proj.weight") @ x).view(heads, dim)
        q = self.rope(self.norm(q, b + "indexer.q_norm.weight"), position)
        self.index_keys.append(self.t(b + "indexer.k_proj.weight") @ x)
        complete = (position + 1) // block
        scores = []
        for j in range(complete):
            pooled = torch.stack(self.index_keys[j * block:(j + 1) * block]).mean(0)
            key = self.rope(self.norm(pooled, b + "indexer.k_norm.weight")[None], j * block)[0]
            scores.append(float(torch.relu(q @ key).sum() / dim ** 0.5))
        best = sorted(range(complete), key=lambda j: (-scores[j], j))[:min(budget // block, complete)]
        chosen = {p for j in best for p in range(j * block, (j + 1) * block)}
        return sorted(chosen | set(range(complete * block, position + 1)))

    def step(self, streams: np.ndarray, next_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One row: the main model's (or the last step's) residual streams [hc * n_embd] and the token after it."""
        b = self.b
        e = self.norm(self.embedding(next_id), b + "nextn.enorm.weight")
        h = self.norm(torch.from_numpy(np.asarray(streams, dtype=np.float64)), b + "nextn.hnorm.weight")
        fc = self.t(b + "nextn.eh_proj.weight")
        u = torch.stack([fc @ torch.cat([e, stream]) for stream in h.view(self.hc, -1)])
        position = len(self.keys)
        x, inject = self.mixer(u, b + "hc_attn", True)
        u = u + inject[:, None] * self.attention(x, position)[None]
        x, inject = self.mixer(u, b + "hc_ffn", True)
        u = u + inject[:, None] * self.moe(x)[None]
        y, _ = self.mixer(u, b + "nextn.hc_head", False)
        return self.head(y), u.reshape(-1)
