"""strata.load: a model file made ready to run, each part where it lives (architecture.md, 'What lives where').

Before anything is allocated the memory plan is checked against the GPU's free memory and the host's
available RAM; what does not fit is refused with the numbers. Then the dense weights go to one VRAM
arena and the routed experts, repacked once, to the CPU pool; the n-gram table stays memory-mapped.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

import numpy as np

from strata.devices import free_memory
from strata.errors import InvalidArgument
from strata.format import ModelFile, inspect
from strata.hostinfo import available_ram_bytes
from strata.kv import KV
from strata.loader import repacked, upload_dense
from strata.models import Geometry
from strata.plan import (KV_PAGE_TOKENS, MemoryPlan, check_fits, file_tensors, is_routed_expert, largest_context,
                         memory_plan)
from strata.pool import ExpertPool
from strata.progress import ByteProgress
from strata.quant import QuantTensor

if TYPE_CHECKING:
    from strata.generation import Session


@dataclass(frozen=True)
class ModelInfo:
    arch: str
    geometry: Geometry
    tensor_types: dict[str, int]  # GGML type name -> tensor count
    plan: MemoryPlan  # the model's parts with the smallest session (one KV page)
    warnings: tuple[str, ...]


def split_gate_up(merged: QuantTensor, n_expert: int) -> tuple[QuantTensor, QuantTensor]:
    """The merged ffn_gate_up_exps tensor as separate gate and up tensors (each expert's first half of rows
    is its gate, the second its up, as llama.cpp's loader reads it)."""
    rows = merged.rows // n_expert
    if merged.rows % n_expert or rows % 2:
        raise InvalidArgument(f"ffn_gate_up_exps: {merged.rows} rows do not split into {n_expert} gate|up pairs")
    halves = []
    for half in (slice(0, rows // 2), slice(rows // 2, rows)):
        planes = {name: np.ascontiguousarray(plane.reshape(n_expert, rows, -1)[:, half].reshape(-1, plane.shape[1]))
                  for name, plane in merged.planes().items()}
        halves.append(QuantTensor(merged.form, n_expert * rows // 2, merged.cols, **planes))
    return halves[0], halves[1]


class Model:
    """A loaded model: `info`, the dense weights in VRAM, the routed experts in the CPU pool."""

    def __init__(self, file: ModelFile, info: ModelInfo, weights, pool: ExpertPool, device: int = 0):
        self.file, self.info, self.weights, self.pool, self.device = file, info, weights, pool, device

    def session(self, context: int | None = None, kv: KV | str = KV.INT8, mode: str = "token_graph",
                timeout: float = 5.0) -> Session:
        """A generation session on the GPU: `context` tokens (default min(context_length, 4096)) of KV in
        format `kv`; `mode` is "token_graph" (one CUDA graph per token), "layer_graphs" or "uncaptured";
        `timeout` bounds every wait on the CPU pool. The native session is `session.engine.native`."""
        from strata.engine import open_session

        return open_session(self, context, kv, mode, timeout, self.device)

    def close(self) -> None:
        self.pool.close()
        self.weights = None
        self.file.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def describe(file: ModelFile) -> ModelInfo:
    return ModelInfo(
        arch=file.arch,
        geometry=file.geometry,
        tensor_types=dict(Counter(info.ggml_type.name for info in file.tensors.values())),
        plan=memory_plan(file.geometry, file_tensors(file), KV_PAGE_TOKENS, KV.INT8),
        warnings=tuple(file.warnings),
    )


def check_memory(file: ModelFile, info: ModelInfo, device: int) -> None:
    """Refuse, before any allocation, a model whose parts do not fit the GPU and the host."""
    free = free_memory(device)
    tensors = file_tensors(file)
    options = {kv: largest_context(info.geometry, tensors, kv, free) for kv in KV}
    check_fits(info.plan, free, available_ram_bytes(), options)


def load_experts(file: ModelFile, pool: ExpertPool, progress: ByteProgress | None) -> None:
    g = file.geometry
    per_layer = [[n for n in file.tensors if is_routed_expert(n) and n.startswith(f"blk.{layer}.")]
                 for layer in range(g.n_layer)]
    tensors = repacked(file, [name for names in per_layer for name in names], progress)
    for layer, names in enumerate(per_layer):
        held = dict(next(tensors) for _ in names)  # this layer's gate/up (or merged gate_up) and down
        prefix = f"blk.{layer}."
        if prefix + "ffn_gate_up_exps.weight" in held:
            gate, up = split_gate_up(held[prefix + "ffn_gate_up_exps.weight"], g.n_expert)
        else:
            gate, up = held[prefix + "ffn_gate_exps.weight"], held[prefix + "ffn_up_exps.weight"]
        pool.set_layer(layer, gate, up, held[prefix + "ffn_down_exps.weight"], g.n_expert)


def load(path: str | os.PathLike[str], *, device: int = 0, threads: int | None = None,
         cache_dir: str | os.PathLike[str] | None = None, progress: bool = True) -> Model:
    """Validate, plan and load the GGUF at `path` onto GPU `device` and the host's CPU pool.

    `cache_dir` keeps the repacked dense weights for the next load; `threads` sets the pool's workers
    (default: every physical core but the first).
    """
    file = inspect(path)
    try:
        info = describe(file)
        check_memory(file, info, device)
        g = info.geometry
        dense_cache = None if cache_dir is None else os.path.join(cache_dir, os.path.basename(file.path) + ".dense")
        weights = upload_dense(file, device, dense_cache, ByteProgress("load: dense weights") if progress else None)
        pool = ExpertPool(g.n_embd, g.expert_ff, g.n_expert_used, threads=threads, pin_caller=False)
        try:
            load_experts(file, pool, ByteProgress("load: routed experts") if progress else None)
        except BaseException:
            pool.close()
            raise
        return Model(file, info, weights, pool, device)
    except BaseException:
        file.close()
        raise
