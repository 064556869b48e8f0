"""The memory plan: every byte a model and a session need, per place, computed before any allocation.

A plan that does not fit is refused with a message that says what does not fit and what would
(a shorter context, a smaller KV format, a smaller expert cache).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any
from dataclasses import dataclass, field

from strata.errors import InvalidArgument, OutOfMemory
from strata.kv import KV
from strata.models import Geometry
from strata.quant import form_for
from strata.quant.forms import FLOAT_DTYPES
from strata.quant.tensor import plane_layout

GIB = 1024**3
KV_PAGE_TOKENS = 256  # KV is allocated in whole pages (a multiple of the 4-token QSA block): session_layout.hpp
QSA_RATIO = 4  # tokens per indexer block (models/qwen4exp.md)
FLOAT32 = 4


def tensor_bytes(ggml_type: int, ne: tuple[int, ...]) -> int:
    """Bytes of a tensor once repacked into its canonical form (docs/forms.md)."""
    form = form_for(ggml_type)
    rows = math.prod(ne[1:])
    if form.is_float:
        return rows * ne[0] * FLOAT_DTYPES[form.float_kind].itemsize
    return sum(dtype.itemsize * math.prod(shape) for dtype, shape in plane_layout(form, rows, ne[0]).values())


def file_tensors(file: Any) -> dict[str, tuple[int, tuple[int, ...]]]:
    """(GGML type, ne) of every tensor of a strata.format.ModelFile: what the plan's functions read."""
    return {name: (info.ggml_type, info.ne) for name, info in file.tensors.items()}


def is_routed_expert(name: str) -> bool:
    return "_exps." in name


def is_ngram_table(name: str) -> bool:
    return name.startswith("per_layer_token_embd")


@dataclass(frozen=True)
class MemoryPlan:
    vram: dict[str, int]
    host: dict[str, int]
    mapped: dict[str, int] = field(default_factory=dict)  # read through the page cache, never resident

    @property
    def vram_total(self) -> int:
        return sum(self.vram.values())

    @property
    def host_total(self) -> int:
        return sum(self.host.values())

    def lines(self) -> list[str]:
        out = [f"VRAM  {self.vram_total / GIB:8.2f} GiB"]
        out += [f"  {name:<28}{nbytes / GIB:8.2f} GiB" for name, nbytes in self.vram.items()]
        out.append(f"host  {self.host_total / GIB:8.2f} GiB")
        out += [f"  {name:<28}{nbytes / GIB:8.2f} GiB" for name, nbytes in self.host.items()]
        out += [f"mapped {name}: {nbytes / GIB:.2f} GiB (page cache, not resident)"
                for name, nbytes in self.mapped.items()]
        return out


def session_shape(g: Geometry) -> dict[str, Any]:
    """The fields of strata/session_layout.hpp's SessionShape, from a geometry."""
    return {
        "recurrent": list(g.recurrent), "n_embd": g.n_embd, "n_vocab": g.n_vocab,
        "n_head_kv": g.n_head_kv, "head_dim": g.head_dim,
        "ssm_k_heads": g.ssm_n_k_heads, "ssm_v_heads": g.ssm_n_v_heads, "ssm_head_k_dim": g.ssm_head_k_dim,
        "ssm_head_v_dim": g.ssm_head_v_dim, "ssm_conv_kernel": g.ssm_conv_kernel,
        "indexer_head_dim": g.indexer_head_dim if g.indexer_n_heads else 0, "indexer_ratio": QSA_RATIO,
        "n_ple_layers": len(g.ple_layers), "ple_history": (g.ple_conv_kernel - 1) * g.ple_ngram if g.ple_layers else 0,
        "hc_count": g.hc_count,
    }


# Plan parts, from the arena's regions (strata/session_layout.hpp is the one definition of what a session holds).
_PARTS = {
    "kv keys": "KV cache", "kv values": "KV cache", "kv page table": "KV cache",
    "gdn state": "GDN recurrent + conv state", "gdn conv history": "GDN recurrent + conv state",
    "indexer raw keys": "QSA indexer keys", "indexer block keys": "QSA indexer keys",
    "ple history": "PLE conv history", "residual streams": "residual streams",
}


def session_state_bytes(g: Geometry, context: int, kv: KV) -> dict[str, int]:
    """Per-sequence state on the GPU for `context` tokens, as the session arena lays it out."""
    from strata import _native

    layout = _native.session_layout(session_shape(g), context, kv.value)
    state: dict[str, int] = {}
    for name, _layer, _offset, nbytes in layout["regions"]:
        part = _PARTS[name] + (f" ({kv.value})" if _PARTS[name] == "KV cache" else "")
        state[part] = state.get(part, 0) + nbytes
    return state


def scratch_bytes(g: Geometry) -> int:
    """Activations of one token: the widest projection outputs, streams, logits, twice over for safety."""
    widest = max(g.n_head * g.head_dim * 2, g.ssm_conv_dim, g.hc_width or g.n_embd, g.n_expert)
    return 2 * FLOAT32 * (16 * widest + g.n_vocab)


def pinned_bytes(g: Geometry) -> int:
    """Doorbell (x, ids, weights, seq, flag), the pool's answer rows and per-token staging."""
    return FLOAT32 * (g.n_embd * (1 + g.n_expert_used) + 2 * g.n_expert_used) + 64 * 1024


def memory_plan(
    g: Geometry,
    tensors: Mapping[str, tuple[int, tuple[int, ...]]],
    context: int,
    kv: KV | str = KV.INT8,
    expert_cache: int = 0,
) -> MemoryPlan:
    """The plan for a model whose tensors are {name: (ggml_type, ne)}, one session of `context` tokens."""
    kv = KV.parse(kv)
    if not 1 <= context <= g.context_length:
        raise InvalidArgument(f"context {context} is outside 1..{g.context_length} (the model's context_length)")
    if expert_cache < 0:
        raise InvalidArgument(f"expert cache size must be >= 0 bytes, got {expert_cache}")
    dense = experts = table = 0
    for name, (ggml_type, ne) in tensors.items():
        nbytes = tensor_bytes(ggml_type, ne)
        if is_routed_expert(name):
            experts += nbytes
        elif is_ngram_table(name):
            table += nbytes
        else:
            dense += nbytes
    vram = {"dense weights": dense, **session_state_bytes(g, context, kv), "scratch": scratch_bytes(g)}
    if expert_cache:
        vram["expert cache"] = min(expert_cache, experts)
    host = {"routed experts": experts, "pinned buffers": pinned_bytes(g)}
    return MemoryPlan(vram=vram, host=host, mapped={"n-gram table": table} if table else {})


def largest_context(g: Geometry, tensors: Mapping[str, tuple[int, tuple[int, ...]]], kv: KV, vram_free: int,
                    expert_cache: int = 0) -> int:
    """The longest context (a whole number of KV pages) whose plan fits in `vram_free`, or 0."""
    lo, hi = 0, -(-g.context_length // KV_PAGE_TOKENS)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        plan = memory_plan(g, tensors, min(mid * KV_PAGE_TOKENS, g.context_length), kv, expert_cache)
        lo, hi = (mid, hi) if plan.vram_total <= vram_free else (lo, mid - 1)
    return min(lo * KV_PAGE_TOKENS, g.context_length)


def check_fits(plan: MemoryPlan, vram_free: int, host_available: int, alternatives: Mapping[KV, int]) -> None:
    """Raise OutOfMemory naming what does not fit and, from `alternatives` ({kv: largest context}), what would."""
    if plan.vram_total > vram_free:
        parts = ", ".join(f"{name} {nbytes / GIB:.2f}" for name, nbytes in plan.vram.items())
        options = [f"context <= {ctx} with kv={kv.value}" for kv, ctx in alternatives.items() if ctx > 0]
        hint = ("; would fit: " + ", ".join(options) if options
                else "; nothing fits: the dense weights alone are too big")
        raise OutOfMemory(
            f"the GPU has {vram_free / GIB:.2f} GiB free, the plan needs {plan.vram_total / GIB:.2f} GiB "
            f"({parts} GiB){hint}"
        )
    if plan.host_total > host_available:
        raise OutOfMemory(
            f"host RAM: {host_available / GIB:.2f} GiB available, the routed experts and pinned buffers need "
            f"{plan.host_total / GIB:.2f} GiB; use a smaller quantization of the experts"
        )
