"""Loading a model: every tensor repacked into its canonical form and put where its role says it lives at run
time (architecture.md, 'What lives where'): dense, elementwise and row-gathered weights to one VRAM arena, the
routed experts to host memory for the CPU pool, or, where the RAM budget does not hold them all, to the pool's
disk tier (docs/tiers.md: some in its arena, read now, the rest read from the file as decoding routes them);
the n-gram table's rows are read from the file as tokens need them."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import numpy as np

from strata.errors import InvalidArgument
from strata.format import ModelFile
from strata.models import Role
from strata.quant import QuantTensor, cache, dequantize, repack
from strata.runtime.plan import specs_of
from strata.runtime.pool import ExpertPool
from strata.runtime.tiers import IO_THREADS, RamPlan, expert_file_bytes

Held = QuantTensor | np.ndarray
Progress = Callable[[int, int], None]
_IN_VRAM = (Role.DENSE, Role.ELEMENTWISE, Role.ROW_GATHERED)
EMBED_FORMS = ("f32", "f16", "bf16", "q8_0")  # what the GPU's embedding gather reads (decode_program.cu)


def gpu_refusals(model: ModelFile) -> list[str]:
    """Why the GPU engine would refuse `model` as it is (empty: it runs), from the tensors' types alone: what
    load and the session check when they get there."""
    from strata.quant import form_for

    specs = specs_of(model.geometry)
    refusals = []
    for name, info in model.tensors.items():
        if name in specs and specs[name].role is Role.ROW_GATHERED and form_for(info.ggml_type).name not in EMBED_FORMS:
            refusals.append(f"{name} is {info.ggml_type.name}: the GPU's embedding gather reads "
                            f"{', '.join(f.upper() for f in EMBED_FORMS)} rows (requantize it to Q8_0)")
    if "tokenizer.ggml.model" not in model.metadata:
        refusals.append("the file carries no tokenizer: run and chat need one (token ids work from Python)")
    return refusals


def dense_names(model: ModelFile) -> list[str]:
    """The tensors that go to VRAM, in file order."""
    specs = specs_of(model.geometry)
    return [name for name in model.tensors if name in specs and specs[name].role in _IN_VRAM]


def repacked(model: ModelFile, names: list[str], progress: Progress | None = None) -> Iterator[tuple[str, Held]]:
    """(name, canonical form) for each of `names`, reporting GGUF bytes done out of the total. Elementwise
    tensors come as float32 whatever the file stores (a PLE conv kernel may be F16, a community file may quantize
    anything 2-D): the decode program reads them elementwise, not through a GEMV."""
    specs = specs_of(model.geometry)
    total = sum(model.tensors[name].nbytes for name in names)
    done = 0
    for name in names:
        info = model.tensors[name]
        held = repack(model.raw(name), info.ggml_type, info.ne, name=name)
        elementwise = name in specs and specs[name].role is Role.ELEMENTWISE
        if elementwise and not (isinstance(held, np.ndarray) and held.dtype == np.float32):
            held = dequantize(held)
        yield name, held
        model.release(name)  # its file pages were read: they leave the process's memory
        done += info.nbytes
        if progress:
            progress(done, total)


def dense_weights(model: ModelFile, cache_path: str | os.PathLike[str] | None = None,
                  progress: Progress | None = None) -> dict[str, Held]:
    """The dense tensors in canonical form. With `cache_path`, a valid cache of this file is memory-mapped
    instead (the second load costs a read, not a repack); a missing or stale one is rebuilt there."""
    def build() -> dict[str, Held]:
        return dict(repacked(model, dense_names(model), progress))

    return build() if cache_path is None else cache.load_or_build(cache_path, model.path, build)


def upload_dense(model: ModelFile, device: int = 0, cache_path: str | os.PathLike[str] | None = None,
                 progress: Progress | None = None):
    """The model's dense weights in VRAM (strata._native.DeviceWeights)."""
    from strata import _native

    return _native.DeviceWeights(dense_weights(model, cache_path, progress), device)


def split_gate_up(merged: Held, n_expert: int) -> tuple[Held, Held]:
    """The merged ffn_gate_up_exps tensor as separate gate and up tensors (each expert's first half of rows
    is its gate, the second its up, as llama.cpp's loader reads it), quantized or float."""
    total = merged.rows if isinstance(merged, QuantTensor) else merged.shape[0]
    rows = total // n_expert
    if total % n_expert or rows % 2:
        raise InvalidArgument(f"ffn_gate_up_exps: {total} rows do not split into {n_expert} gate|up pairs")

    def half_of(plane: np.ndarray, half: slice) -> np.ndarray:
        return np.ascontiguousarray(plane.reshape(n_expert, rows, -1)[:, half].reshape(-1, plane.shape[1]))

    halves = []
    for half in (slice(0, rows // 2), slice(rows // 2, rows)):
        if isinstance(merged, QuantTensor):
            planes = {name: half_of(plane, half) for name, plane in merged.planes().items()}
            halves.append(QuantTensor(merged.form, n_expert * rows // 2, merged.cols, **planes))
        else:
            halves.append(half_of(merged, half))
    return halves[0], halves[1]


def load_experts(file: ModelFile, pool: ExpertPool, progress: Progress | None = None,
                 ram: RamPlan | None = None, *, direct: bool = True) -> None:
    """Every layer's routed experts registered with the CPU pool, layer by layer: repacked here into host RAM, or,
    where `ram` tiers them, each tiered layer's arena read by the pool from the file (O_DIRECT unless `direct` is
    off) and the rest left there; only those bytes of the file are read."""
    if ram is not None and ram.tiered:
        load_tiered(file, pool, ram, progress, direct)
        return
    g = file.geometry
    specs = specs_of(g)
    per_layer: list[list[str]] = [[] for _ in range(g.n_layer)]
    for name in file.tensors:
        spec = specs.get(name)
        if spec is not None and spec.role is Role.ROUTED_EXPERT:
            per_layer[spec.layer].append(name)
    tensors = repacked(file, [name for names in per_layer for name in names], progress)
    for layer, names in enumerate(per_layer):
        # This layer's gate/up (or merged gate_up) and down. A float form comes from repack as a view of the
        # mapped file: the pool gets its own copy, resident like a repacked quantized form (and as the memory
        # plan counts it), never paged in from the file in the middle of a token.
        held = {name: np.array(t) if isinstance(t, np.ndarray) else t for name, t in (next(tensors) for _ in names)}
        prefix = f"blk.{layer}."
        if prefix + "ffn_gate_up_exps.weight" in held:
            gate, up = split_gate_up(held[prefix + "ffn_gate_up_exps.weight"], g.n_expert)
        else:
            gate, up = held[prefix + "ffn_gate_exps.weight"], held[prefix + "ffn_up_exps.weight"]
        pool.set_layer(layer, gate, up, held[prefix + "ffn_down_exps.weight"], g.n_expert)


def load_tiered(file: ModelFile, pool: ExpertPool, ram: RamPlan, progress: Progress | None, direct: bool) -> None:
    """The tiered layers of `ram` registered with the pool, each arena starting with its lowest expert ids."""
    pool.open_file(str(file.path), direct=direct, io_threads=IO_THREADS)
    total = sum(ram.slots[layer] * expert_file_bytes(m) for layer, m in ram.matrices.items())
    done = 0
    for layer, matrices in ram.matrices.items():
        slots = ram.slots[layer]
        pool.set_tiered_layer(layer, matrices, file.geometry.n_expert, slots, list(range(slots)))
        done += slots * expert_file_bytes(matrices)
        if progress:
            progress(done, total)
