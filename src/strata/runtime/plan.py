"""The memory plan: every byte a model and a session need, per place, computed before any allocation.

A tensor's place follows from its role (strata.models.Role); a session's state is the native session layout
(cuda/include/strata/session_layout.hpp), read through the binding, so the plan and the allocation cannot
disagree. A plan that does not fit is refused with what does not fit and what would (a shorter context, a
smaller KV format).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from strata.errors import InvalidArgument, OutOfMemory
from strata.models import Geometry, Role, TensorSpec, tensor_specs
from strata.options import DEFAULT_KV, DEFAULT_SNAPSHOTS, KV
from strata.quant import form_for
from strata.quant.forms import FLOAT_DTYPES
from strata.quant.tensor import plane_layout
from strata.runtime.geometry import native_geometry

GIB = 1024**3
FLOAT32 = 4

Tensors = Mapping[str, tuple[int, tuple[int, ...]]]  # name -> (ggml_type, ne)
DENSE_ROLES = (Role.DENSE, Role.ELEMENTWISE, Role.ROW_GATHERED)  # the plan's "dense weights": the VRAM arena's


def size_text(nbytes: int) -> str:
    """Bytes for people: GiB from a tenth of one, else MiB."""
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= GIB // 10 else f"{nbytes / 2**20:.2f} MiB"


def kv_page_tokens() -> int:
    """Tokens per KV page: sessions hold whole pages (the native layout's granularity)."""
    from strata import _native

    return _native.KV_PAGE_TOKENS


def tensor_bytes(ggml_type: int, ne: tuple[int, ...]) -> int:
    """Bytes of a tensor once repacked into its canonical form (docs/forms.md)."""
    form = form_for(ggml_type)
    rows = math.prod(ne[1:])
    if form.is_float:
        return rows * ne[0] * FLOAT_DTYPES[form.float_kind].itemsize
    return sum(dtype.itemsize * math.prod(shape) for dtype, shape in plane_layout(form, rows, ne[0]).values())


def file_tensors(file) -> dict[str, tuple[int, tuple[int, ...]]]:
    """(GGML type, ne) of every tensor of a strata.format.ModelFile: what the plan's functions read."""
    return {name: (info.ggml_type, info.ne) for name, info in file.tensors.items()}


@functools.lru_cache(maxsize=4)
def specs_of(g: Geometry) -> Mapping[str, TensorSpec]:
    """The spec (layer, role) of every tensor a file of `g` may hold, derived once per geometry: the plan, the
    expert cache's figures and the loader all place tensors by these roles."""
    return tensor_specs(g)


def bytes_by_layer(g: Geometry, tensors: Tensors) -> dict[int | None, dict[Role, int]]:
    """Canonical bytes of the tensors of each layer (None: the model's own, outside every layer: embedding, head,
    n-gram table) by role; tensors without a role are not loaded, so not counted."""
    specs = specs_of(g)
    out: dict[int | None, dict[Role, int]] = {layer: dict.fromkeys(Role, 0) for layer in [*range(g.n_layer), None]}
    for name, (ggml_type, ne) in tensors.items():
        if name in specs:
            out[specs[name].layer][specs[name].role] += tensor_bytes(ggml_type, ne)
    return out


def bytes_by_role(g: Geometry, tensors: Tensors) -> dict[Role, int]:
    """Canonical bytes of the tensors of each role (tensors without a role are not loaded, so not counted)."""
    out = dict.fromkeys(Role, 0)
    for roles in bytes_by_layer(g, tensors).values():
        for role, nbytes in roles.items():
            out[role] += nbytes
    return out


@dataclass(frozen=True)
class TierBytes:
    """The routed experts below VRAM when a RAM budget tiers them (strata.runtime.tiers, docs/tiers.md)."""

    in_ram: int   # in the CPU pool's page-locked arenas
    staging: int  # the disk tier's staging
    on_disk: int  # left in the model file, read as decoding routes them


@dataclass(frozen=True)
class MemoryPlan:
    vram: dict[str, int]
    host: dict[str, int]
    mapped: dict[str, int] = field(default_factory=dict)  # read from the file as needed, never resident
    disk: dict[str, int] = field(default_factory=dict)    # left in the file, read as decoding routes them

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
        out += [f"mapped {name}: {nbytes / GIB:.2f} GiB (rows read from the file as tokens need them)"
                for name, nbytes in self.mapped.items()]
        out += [f"disk  {name}: {nbytes / GIB:.2f} GiB (read from the file as decoding routes them)"
                for name, nbytes in self.disk.items()]
        return out


# Plan parts, from the arena's regions.
_PARTS = {
    "kv keys": "KV cache", "kv values": "KV cache", "kv page table": "KV cache",
    "gdn state": "GDN recurrent + conv state", "gdn conv history": "GDN recurrent + conv state",
    "indexer raw keys": "QSA indexer keys", "indexer block keys": "QSA indexer keys",
    "ple history": "PLE conv history", "residual streams": "residual streams",
    "state snapshots": "state snapshots",
}


_STREAMED_PARTS = {"kv keys": "KV host copy", "kv values": "KV host copy", "indexer raw keys": "QSA raw indexer keys",
                   "kv window": "KV window"}


# The regions a state snapshot copies (session_layout.cpp, is_recurrent_state): one "state snapshots" region holds
# `snapshots` copies of them, each at the span it takes in the arena.
RECURRENT_STATE = ("gdn state", "gdn conv history", "ple history")


@dataclass(frozen=True)
class StateRegion:
    """One region of a session's arena as the plan names it."""

    name: str    # the native layout's ("kv keys", "gdn state", ...)
    part: str    # the plan's ("KV cache (int8)", "GDN recurrent + conv state", ...)
    layer: int   # the layer whose state it is; -1: the sequence's (PLE history, residual streams, snapshots)
    nbytes: int
    span: int    # what it takes in its arena: up to the next region (regions start at aligned offsets)
    host: bool   # page-locked host memory (KV streaming), else VRAM


def session_regions(g: Geometry, context: int, kv: KV, snapshots: int = DEFAULT_SNAPSHOTS, *,
                    kv_streaming: bool = False) -> list[StateRegion]:
    """Every region of one sequence's state for `context` tokens, as the native session layout lays it out."""
    from strata import _native

    layout = _native.session_layout(native_geometry(g), context, kv.value, snapshots, kv_streaming)
    regions = layout["regions"]
    spans = [0] * len(regions)
    for place, end in (("device", layout["total"]), ("host", layout["host_total"])):
        order = sorted((i for i, region in enumerate(regions) if region[4] == place), key=lambda i: regions[i][2])
        for i, following in zip(order, [*(regions[j][2] for j in order[1:]), end]):
            spans[i] = following - regions[i][2]
    out = []
    for (name, layer, _offset, nbytes, place), span in zip(regions, spans):
        part = _STREAMED_PARTS[name] if kv_streaming and name in _STREAMED_PARTS else _PARTS[name]
        if part.startswith("KV"):
            part += f" ({kv.value})"
        out.append(StateRegion(name, part, layer, nbytes, span, place == "host"))
    return out


def session_state_bytes(g: Geometry, context: int, kv: KV, snapshots: int = DEFAULT_SNAPSHOTS, *,
                        kv_streaming: bool = False) -> tuple[dict[str, int], dict[str, int]]:
    """Per-sequence state for `context` tokens as the session arena lays it out: (VRAM parts, host parts); the
    host holds parts only under KV streaming (the streamed KV and raw indexer keys, page-locked)."""
    places: dict[bool, dict[str, int]] = {False: {}, True: {}}
    for region in session_regions(g, context, kv, snapshots, kv_streaming=kv_streaming):
        places[region.host][region.part] = places[region.host].get(region.part, 0) + region.nbytes
    return places[False], places[True]


SORT_KEY = 8  # bytes of the GPU sampler's sort keys (cuda/src/kernels/sample.cu)
# What a session takes beyond its buffers: cudaMalloc rounds each allocation up to 2 MiB pages, and instantiating
# its CUDA graphs takes device memory of its own (benchmarks/check_largest_context.py measures both on a GPU).
SESSION_SLACK_BYTES = 16 << 20


def sampler_bound(n_vocab: int) -> int:
    """The GPU sampler's workspace where no device can be asked (its radix sort's size is the device's): its
    two key arrays, the sort's alternate keys and 256 KiB for its histograms and tile states (tests/runtime/test_plan.py
    checks it against the device's figure)."""
    return 3 * SORT_KEY * n_vocab + (256 << 10)


def sampler_bytes(n_vocab: int) -> int:
    """The GPU sampler's workspace: the current device's figure, else sampler_bound."""
    from strata import _native
    from strata.devices import device_count

    return _native.sampler_workspace_bytes(n_vocab) if device_count() > 0 else sampler_bound(n_vocab)


def scratch_bytes(g: Geometry, context: int, *, sampler: bool = True) -> int:
    """The decode session's device scratch for `context` tokens, as the native session sizes it: per-token
    buffers, RoPE tables, the penalty's history, QSA block scores and, with `sampler`, the sampler's workspace
    (a layer range that runs no head samples nothing: strata.runtime.layer_ranges)."""
    from strata import _native

    return _native.decode_scratch_bytes(native_geometry(g), context, sampler_bytes(g.n_vocab) if sampler else 0)


def pinned_bytes(g: Geometry) -> int:
    """Doorbell (x, ids, weights, seq, flag), the pool's answer rows and per-token staging, and the doorbell of a
    step of several rows (x, answer, ids and weights of MAX_STEP_ROWS rows)."""
    from strata import _native

    one_token = g.n_embd * (1 + g.n_expert_used) + 2 * g.n_expert_used
    step_rows = _native.MAX_STEP_ROWS * 2 * (g.n_embd + g.n_expert_used)
    return FLOAT32 * (one_token + step_rows) + 64 * 1024


def prompt_scratch_bytes(g: Geometry, chunk: int, context: int, kv: KV | str = DEFAULT_KV,
                         kv_streaming: bool = False) -> int:
    """A session's prompt path scratch for chunks of `chunk` tokens (0: no prompt path), as the native session
    sizes it; under KV streaming it holds one attention layer's whole KV in `kv` while a chunk runs it."""
    from strata import _native

    if not chunk:
        return 0
    return _native.prompt_scratch_bytes(native_geometry(g), chunk, context, KV.parse(kv).value, kv_streaming)


def check_context(g: Geometry, context: int) -> None:
    """InvalidArgument unless a session of `context` tokens is within the model's context_length."""
    if not 1 <= context <= g.context_length:
        raise InvalidArgument(f"context {context} is outside 1..{g.context_length} (the model's context_length)")


def memory_plan(g: Geometry, tensors: Tensors, context: int, kv: KV | str = DEFAULT_KV,
                snapshots: int = DEFAULT_SNAPSHOTS, expert_cache: int = 0, prompt_staging: int = 0,
                prompt_chunk: int = 0, *, kv_streaming: bool = False, tiers: TierBytes | None = None) -> MemoryPlan:
    """The plan for a model whose tensors are {name: (ggml_type, ne)} with `expert_cache` bytes of routed experts
    in VRAM (strata.runtime.expert_cache) and `prompt_staging` bytes of the prompt path's staging
    (strata.runtime.prompt), one session of `context` tokens with `snapshots` slots of recurrent state and a
    prompt path of `prompt_chunk` tokens per chunk (0: none); with `kv_streaming`, the attention layers' KV in
    page-locked host memory and a VRAM window of it (docs/session.md, "KV streaming"); with `tiers`, the routed
    experts split between host RAM and the file (docs/tiers.md), else all in host RAM."""
    kv = KV.parse(kv)
    check_context(g, context)
    parts = bytes_by_role(g, tensors)
    dense = sum(parts[role] for role in DENSE_ROLES)
    model = {"expert cache": expert_cache} if expert_cache else {}
    if prompt_staging:
        model["prompt staging"] = prompt_staging
    prompt = ({"prompt scratch": prompt_scratch_bytes(g, prompt_chunk, context, kv, kv_streaming)}
              if prompt_chunk else {})
    on_device, on_host = session_state_bytes(g, context, kv, snapshots, kv_streaming=kv_streaming)
    vram = {"dense weights": dense, **model, **on_device, "scratch": scratch_bytes(g, context), **prompt,
            "allocation slack": SESSION_SLACK_BYTES}
    experts = parts[Role.ROUTED_EXPERT] if tiers is None else tiers.in_ram
    host = {"routed experts": experts, "pinned buffers": pinned_bytes(g), **on_host}
    if tiers is not None:
        host["disk tier staging"] = tiers.staging
    table = parts[Role.NGRAM_TABLE]
    return MemoryPlan(vram=vram, host=host, mapped={"n-gram table": table} if table else {},
                      disk={"routed experts": tiers.on_disk} if tiers is not None else {})


def largest_context(g: Geometry, tensors: Tensors, kv: KV, vram_free: int, snapshots: int = DEFAULT_SNAPSHOTS,
                    expert_cache: int = 0, prompt_staging: int = 0, prompt_chunk: int = 0, *,
                    kv_streaming: bool = False) -> int:
    """The longest context (a whole number of KV pages) whose plan fits in `vram_free`, or 0."""
    page = kv_page_tokens()
    lo, hi = 0, -(-g.context_length // page)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        ctx = min(mid * page, g.context_length)
        plan = memory_plan(g, tensors, ctx, kv, snapshots, expert_cache, prompt_staging, min(prompt_chunk, ctx),
                           kv_streaming=kv_streaming)
        lo, hi = (mid, hi) if plan.vram_total <= vram_free else (lo, mid - 1)
    return min(lo * page, g.context_length)


def check_fits(g: Geometry, tensors: Tensors, context: int, kv: KV | str, *, vram_free: int, device: int,
               resident: int = 0, host_available: int | None = None, snapshots: int = DEFAULT_SNAPSHOTS,
               expert_cache: int = 0, prompt_staging: int = 0, prompt_chunk: int = 0,
               kv_streaming: bool = False, host_resident: int = 0, tiers: TierBytes | None = None) -> MemoryPlan:
    """The plan of one session of `context` tokens in `kv` with `snapshots` state slots beside `expert_cache`
    bytes of cached experts, refused with OutOfMemory unless it fits: on GPU `device` its VRAM beyond the
    `resident` bytes already there (a loaded model's dense weights and cache) within `vram_free`; with
    `host_available`, its host part beyond the `host_resident` bytes already there (a loaded model's experts)
    within that. The refusal names the parts and what fits (each KV format, and KV streaming where the model's
    attention can stream). `tiers`: the routed experts below VRAM as a RAM budget split them (None: all in RAM)."""
    kv = KV.parse(kv)
    plan = memory_plan(g, tensors, context, kv, snapshots, expert_cache, prompt_staging, prompt_chunk,
                       kv_streaming=kv_streaming, tiers=tiers)
    need = plan.vram_total - resident
    if need > vram_free:
        streams = [False, True] if can_stream(g) else [False]
        would = [f"context <= {fits} with kv={k.value}{' and KV streaming' if stream else ''}"
                 for stream in streams for k in KV
                 if (fits := largest_context(g, tensors, k, vram_free + resident, snapshots, expert_cache,
                                             prompt_staging, prompt_chunk, kv_streaming=stream)) > 0]
        parts = ", ".join(f"{name} {nbytes / GIB:.2f}" for name, nbytes in plan.vram.items())
        placed = f", {resident / GIB:.2f} GiB of it in place" if resident else ""
        hint = ("would fit: " + ", ".join(would) if would
                else "nothing fits, not even one KV page beside the dense weights")
        if expert_cache:
            hint += f"; or a smaller expert cache (it holds {expert_cache / GIB:.2f} GiB)"
        streamed = " with KV streaming" if kv_streaming else ""
        raise OutOfMemory(f"GPU {device} has {vram_free / GIB:.2f} GiB free; the plan of context {context} with "
                          f"kv={kv.value}{streamed} needs {plan.vram_total / GIB:.2f} GiB ({parts} GiB{placed}); "
                          f"{hint}")
    if host_available is not None and plan.host_total - host_resident > host_available:
        parts = ", ".join(f"{name} {nbytes / GIB:.2f}" for name, nbytes in plan.host.items())
        raise OutOfMemory(
            f"host RAM: {host_available / GIB:.2f} GiB available, the plan needs {plan.host_total / GIB:.2f} GiB "
            f"({parts} GiB); use a smaller quantization of the experts, or a RAM budget (ram_budget) that leaves "
            "some of them on disk"
            + (", a shorter context or a smaller KV format" if kv_streaming else "")
        )
    return plan


def can_stream(g: Geometry) -> bool:
    """Whether KV streaming serves this model: every attention layer has a QSA indexer, so a token reads a
    bounded selection of its cells (the native layout refuses the others)."""
    return g.indexer_head_dim > 0  # the native layout's rule (session_layout.cpp)
