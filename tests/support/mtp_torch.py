"""An MTP block of qwen3next / qwen35moe in torch, float64, written from the equations of vLLM's qwen3_next_mtp.py
and llama.cpp's qwen35moe graph_mtp, independently of strata.reference: the oracle the reference's block is held to.

Weights are GGUF-named float arrays (numpy shape = reversed ggml ne, so a matrix is [out, in]); norms are the
stored gammas (the converter's 1 + w).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch


class TorchMtp:
    """The block of layer `layer` with its own K/V rows; `step(hidden, next_ids)` appends rows at the next
    positions and returns (logits, the hidden state a chained draft reads), both float64 tensors."""

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
        """Rotate-half RoPE on the first rope_dim dims of each head of x [heads, head_dim]."""
        half = self.rope_dim // 2
        freq = self.rope_theta ** (-torch.arange(half, dtype=torch.float64) * 2 / self.rope_dim)
        c, s = torch.cos(position * freq), torch.sin(position * freq)
        a, b = x[:, :half], x[:, half:2 * half]
        return torch.cat([a * c - b * s, b * c + a * s, x[:, 2 * half:]], dim=-1)

    def attention(self, x: torch.Tensor, position: int) -> torch.Tensor:
        b, d = self.b, self.head_dim
        qg = (self.t(b + "attn_q.weight") @ x).view(self.n_head, 2 * d)
        q = self.rope(self.norm(qg[:, :d], b + "attn_q_norm.weight"), position)
        k = self.rope(self.norm((self.t(b + "attn_k.weight") @ x).view(self.n_head_kv, d), b + "attn_k_norm.weight"),
                      position)
        self.keys.append(k)
        self.values.append((self.t(b + "attn_v.weight") @ x).view(self.n_head_kv, d))
        keys, values = torch.stack(self.keys, 1), torch.stack(self.values, 1)   # [kv heads, positions, d]
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

    def step(self, hidden: np.ndarray, next_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One row: the main model's (or the last step's) hidden state [n_embd] and the token after it."""
        b = self.b
        own = b + "nextn.embed_tokens.weight"
        embedding = own if self.has(own) else "token_embd.weight"
        e = self.norm(self.t(embedding)[next_id], b + "nextn.enorm.weight")
        h = self.norm(torch.from_numpy(np.asarray(hidden, dtype=np.float64)), b + "nextn.hnorm.weight")
        u = self.t(b + "nextn.eh_proj.weight") @ torch.cat([e, h])
        u = u + self.attention(self.norm(u, b + "attn_norm.weight"), len(self.keys))
        u = u + self.moe(self.norm(u, b + "post_attention_norm.weight"))
        out = self.norm(u, b + "nextn.shared_head_norm.weight")
        heads = (b + "nextn.shared_head_head.weight", "output.weight", "token_embd.weight")
        head = next(name for name in heads if self.has(name))
        return self.t(head) @ out, out
