"""The routed experts below VRAM (docs/tiers.md): the RAM budget a load may take, and where it puts the experts
within it: every one in host RAM as repacked arrays (the budget holds them), or every MoE layer tiered, each with
the same number of experts in the CPU pool's page-locked arena (the first layers one more where bytes are left)
and the rest read from the model file as decoding routes them.

The budget covers the host memory the loaded model keeps: the routed experts in RAM, the disk tier's staging and
the pinned buffers of a session. The dense weights pass through host memory at load (repacked there before they
go to VRAM), so a budget below the dense part cannot load the model and is refused with the figures. Every byte
count is the native pool's own (strata.runtime.pool.tier_sizes), so the plan and the allocations agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from strata.errors import OutOfMemory
from strata.format import ModelFile
from strata.models import Geometry, Role
from strata.quant import form_for
from strata.runtime.host import available_ram_bytes, meminfo_bytes
from strata.runtime.plan import (
    DENSE_ROLES, GIB, Tensors, TierBytes, bytes_by_role, file_tensors, pinned_bytes, size_text, specs_of,
)
from strata.runtime.pool import FileMatrix, tier_sizes, tier_types

# What a load leaves to the rest of the machine when it picks the budget itself: a sixteenth of the RAM, at least
# 1 GiB (the GPU driver, the process's own heap, other programs). Small, because a model that fitted MemAvailable
# loaded whole before the budget existed, and a tiered load has no VRAM cache yet (docs/tiers.md).
RESERVE_SHARE = 16
MIN_RESERVE = 1 * GIB
# The I/O threads of the disk tier: reads in flight. An NVMe drive reaches its rate with a few large reads in
# flight; the reads are whole matrices of an expert.
IO_THREADS = 8


@dataclass(frozen=True)
class RamBudget:
    nbytes: int
    source: str  # how it was chosen: given, or what the machine can spare

    @property
    def line(self) -> str:
        return f"{size_text(self.nbytes)} ({self.source})"


@dataclass(frozen=True)
class RamPlan:
    """Where a load puts the routed experts below VRAM, decided before anything is allocated."""

    budget: RamBudget
    slots: tuple[int, ...]       # per layer: its experts in host RAM (all of them where whole; 0: no experts)
    matrices: dict[int, tuple[FileMatrix, FileMatrix, FileMatrix]]  # per tiered layer: where its experts lie
    expert_ram: int              # the experts' bytes in host RAM: the repacked arrays, or the arenas
    staging: int                 # the disk tier's staging (0: nothing tiered)
    on_disk: int                 # the file bytes of the experts left on disk
    n_expert: int

    @property
    def tiered(self) -> bool:
        return bool(self.matrices)

    @property
    def tier_bytes(self) -> TierBytes | None:
        """The plan's figures for the memory plan (None: every expert in RAM)."""
        return TierBytes(self.expert_ram, self.staging, self.on_disk) if self.tiered else None

    def lines(self) -> list[str]:
        held = sum(self.slots)
        total = self.n_expert * sum(1 for s in self.slots if s or self.tiered)
        lines = [f"RAM budget  {self.budget.line}"]
        if not self.tiered:
            return lines + [f"  routed experts all in host RAM: {size_text(self.expert_ram)}"]
        return lines + [
            f"  routed experts in pinned RAM: {held} of {total} ({held / max(total, 1):.0%}), "
            f"{size_text(self.expert_ram)}, moved by what decoding routes",
            f"  routed experts on disk: {total - held}, {size_text(self.on_disk)} of the file, read as routed",
            f"  disk tier staging: {size_text(self.staging)}",
        ]


def spare_ram(proc: Path = Path("/proc")) -> RamBudget:
    """What the machine can spare now: MemAvailable less a reserve of a sixteenth of MemTotal (at least 1 GiB)."""
    available = available_ram_bytes(proc)
    try:
        total = meminfo_bytes((proc / "meminfo").read_text(), "MemTotal")
    except OSError:
        total = 0
    reserve = max(MIN_RESERVE, total // RESERVE_SHARE)
    return RamBudget(max(0, available - reserve),
                     f"what the machine can spare: {size_text(available)} available less a reserve of "
                     f"{size_text(reserve)}")


def ram_budget(nbytes: int | None, proc: Path = Path("/proc")) -> RamBudget:
    """`nbytes` as the budget (refused past what the machine has available), or None: spare_ram()."""
    if nbytes is None:
        return spare_ram(proc)
    available = available_ram_bytes(proc)
    if available and nbytes > available:
        raise OutOfMemory(f"ram_budget {size_text(nbytes)} is more than the {size_text(available)} this machine has "
                          "available now")
    return RamBudget(nbytes, "ram_budget")


def file_matrices(file: ModelFile, layer: int) -> tuple[FileMatrix, FileMatrix, FileMatrix] | None:
    """Where layer `layer`'s routed experts lie in the file: gate, up and down (a merged gate_up tensor holds each
    expert's gate rows, then its up rows, as llama.cpp's loader reads it); None for a layer without them."""
    g, prefix = file.geometry, f"blk.{layer}."
    tensors = file.tensors
    down = tensors.get(prefix + "ffn_down_exps.weight")
    if down is None:
        return None

    def matrix(info, rows: int, first_row: int = 0) -> FileMatrix:
        cols = int(info.ne[0])
        stride = info.nbytes // g.n_expert
        row_bytes = stride // int(info.ne[1])
        return FileMatrix(form_for(info.ggml_type), rows, cols, int(info.ggml_type),
                          file.data_start + info.offset + first_row * row_bytes, stride)

    merged = tensors.get(prefix + "ffn_gate_up_exps.weight")
    if merged is not None:
        ff = int(merged.ne[1]) // 2
        gate, up = matrix(merged, ff), matrix(merged, ff, ff)
    else:
        gate = matrix(tensors[prefix + "ffn_gate_exps.weight"], g.expert_ff)
        up = matrix(tensors[prefix + "ffn_up_exps.weight"], g.expert_ff)
    return gate, up, matrix(down, g.n_embd)


def expert_layers(g: Geometry, tensors: Tensors) -> list[int]:
    """The layers with routed experts, in order."""
    specs = specs_of(g)
    return sorted({specs[name].layer for name in tensors if name in specs and specs[name].role is Role.ROUTED_EXPERT})


@dataclass(frozen=True)
class _Parts:
    """A file's figures for the plan: the dense part, every routed expert in RAM, the pinned buffers, the MoE
    layers."""

    dense: int
    experts: int
    pinned: int
    layers: list[int]


def _parts(file: ModelFile) -> _Parts:
    g, tensors = file.geometry, file_tensors(file)
    roles = bytes_by_role(g, tensors)
    return _Parts(sum(roles[role] for role in DENSE_ROLES), roles[Role.ROUTED_EXPERT], pinned_bytes(g),
                  expert_layers(g, tensors))


def _tiering(file: ModelFile, budget: RamBudget, parts: _Parts):
    """Where each MoE layer's experts lie in the file, one expert's (arena slot, staging bounce) bytes per layer,
    and the staging: refused (OutOfMemory) where a type is one the tier does not read."""
    g = file.geometry
    matrices = {layer: file_matrices(file, layer) for layer in parts.layers}
    refused = sorted({form_for(m.ggml_type).name for ms in matrices.values() for m in ms
                      if m.ggml_type not in tier_types()})
    if refused:
        raise OutOfMemory(f"the routed experts take {size_text(parts.experts)}, more than the RAM budget "
                          f"{budget.line} holds, and the disk tier does not read {', '.join(refused)} experts yet "
                          "(the lattice i-quants): requantize them, or give a budget that holds them all")
    sizes = {layer: tier_sizes(layer, m, g.n_expert) for layer, m in matrices.items()}
    # two halves of n_expert_used slots, each as large as the largest layer's expert and its reads
    staging = 2 * g.n_expert_used * (max(s for s, _ in sizes.values()) + max(b for _, b in sizes.values()))
    return matrices, sizes, staging


def plan_ram(file: ModelFile, budget: RamBudget) -> RamPlan:
    """The placement of `file`'s routed experts within `budget`: all in RAM where they fit beside the pinned
    buffers, else every MoE layer tiered. Refused (OutOfMemory, with the figures) where the budget is below the
    dense part, or holds not even the disk tier's staging, or the file has expert types the tier does not read."""
    g = file.geometry
    parts = _parts(file)
    if budget.nbytes < parts.dense:
        raise OutOfMemory(f"RAM budget {budget.line} is below the dense part's {size_text(parts.dense)}, which is "
                          "repacked in host memory at load before it goes to VRAM")
    if parts.experts + parts.pinned <= budget.nbytes:
        slots = tuple(g.n_expert if layer in parts.layers else 0 for layer in range(g.n_layer))
        return RamPlan(budget, slots, {}, parts.experts, 0, 0, g.n_expert)
    matrices, sizes, staging = _tiering(file, budget, parts)
    room = budget.nbytes - parts.pinned - staging
    if room < 0:
        raise OutOfMemory(f"RAM budget {budget.line} holds not even the disk tier's staging ({size_text(staging)}) "
                          f"and the pinned buffers ({size_text(parts.pinned)})")
    held = arena_slots([sizes[layer][0] for layer in parts.layers], g.n_expert, room)
    slots = [0] * g.n_layer
    for layer, n in zip(parts.layers, held):
        slots[layer] = n
    on_disk = sum((g.n_expert - slots[layer]) * expert_file_bytes(matrices[layer]) for layer in parts.layers)
    expert_ram = sum(slots[layer] * sizes[layer][0] for layer in parts.layers)
    return RamPlan(budget, tuple(slots), matrices, expert_ram, staging, on_disk, g.n_expert)


def share_budget(file: ModelFile, share: float) -> RamBudget:
    """The budget that holds `share` (0..1) of each layer's routed experts in RAM (rounded to whole experts, all
    of them at 1), beside the staging and the pinned buffers, and at least the dense part."""
    g = file.geometry
    parts = _parts(file)
    what = f"{share:.0%} of the routed experts"
    if share >= 1:
        return RamBudget(max(parts.dense, parts.experts + parts.pinned), what)
    _, sizes, staging = _tiering(file, RamBudget(0, what), parts)
    held = sum(round(share * g.n_expert) * sizes[layer][0] for layer in parts.layers)
    return RamBudget(max(parts.dense, parts.pinned + staging + held), what)


def matrix_file_bytes(m: FileMatrix) -> int:
    """One expert's bytes of matrix `m` in the file: its blocks."""
    elements, nbytes = GGML_QUANT_SIZES[T(m.ggml_type)]
    return m.rows * m.cols // elements * nbytes


def expert_file_bytes(matrices: tuple[FileMatrix, FileMatrix, FileMatrix]) -> int:
    """One expert's bytes in the file: its gate, up and down blocks."""
    return sum(matrix_file_bytes(m) for m in matrices)


def arena_slots(slot_bytes: list[int], n_expert: int, room: int) -> list[int]:
    """The arena slots of layers whose expert takes `slot_bytes` each within `room` bytes: the same number for
    every layer, then one more for the first layers while bytes are left (the VRAM cache's rule)."""
    if not slot_bytes:
        return []
    each = min(n_expert, room // sum(slot_bytes))
    left = room - each * sum(slot_bytes)
    slots = [each] * len(slot_bytes)
    for i, nbytes in enumerate(slot_bytes):
        if each < n_expert and nbytes <= left:
            slots[i] += 1
            left -= nbytes
    return slots
