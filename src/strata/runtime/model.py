"""strata.load: a model file made ready to run, each part where it lives (architecture.md, 'What lives where'),
and Model.session: a generation session on the GPU engine.

Before anything is allocated the memory plan is checked against the GPU's free memory and the host's
available RAM; what does not fit is refused with the numbers. Then the dense weights go to one VRAM
arena and the routed experts, repacked once, to the CPU pool; the n-gram table stays memory-mapped.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from types import TracebackType

from strata.devices import free_memory
from strata.errors import InvalidArgument
from strata.format import ModelFile, inspect
from strata.generation import Session, session_context
from strata.models import Geometry
from strata.options import KV, Mode
from strata.progress import ByteProgress
from strata.runtime.engine import GpuEngine
from strata.runtime.geometry import native_geometry
from strata.runtime.host import available_ram_bytes
from strata.runtime.loader import load_experts, upload_dense
from strata.runtime.plan import DEFAULT_SNAPSHOTS, MemoryPlan, check_fits, file_tensors, kv_page_tokens, memory_plan
from strata.runtime.ple_rows import PleRows
from strata.runtime.pool import ExpertPool

@dataclass(frozen=True)
class ModelInfo:
    arch: str
    geometry: Geometry
    tensor_types: dict[str, int]  # GGML type name -> tensor count
    plan: MemoryPlan  # the model's parts with the smallest session (one KV page)
    warnings: tuple[str, ...]


class Model:
    """A loaded model: `info`, the dense weights in VRAM, the routed experts in the CPU pool."""

    def __init__(self, file: ModelFile, info: ModelInfo, weights, pool: ExpertPool, device: int = 0):
        self.file, self.info, self.weights, self.pool, self.device = file, info, weights, pool, device

    @property
    def tokenizer(self):
        """The file's tokenizer (strata.format.Tokenizer): encode, decode, count, the chat template."""
        return self.file.tokenizer()

    def session(self, context: int | None = None, kv: KV | str = KV.INT8, mode: Mode | str = Mode.TOKEN_GRAPH,
                timeout: float = 5.0, snapshots: int = DEFAULT_SNAPSHOTS) -> Session:
        """A generation session on the GPU: `context` tokens (default min(context_length, 4096)) of KV in
        format `kv`; `mode` says how a token is launched (strata.Mode); `timeout` bounds every wait on the CPU
        pool; `snapshots` states are kept for prefix reuse (the turn boundaries a conversation rolls back to).
        The native session is `session.engine.native`."""
        g = self.info.geometry
        kv, mode = KV.parse(kv), Mode.parse(mode)
        if not timeout > 0:
            raise InvalidArgument(f"timeout must be > 0 seconds, got {timeout}")
        context = session_context(context, g.context_length)
        from strata import _native  # the extension is optional for `import strata`; a session needs it

        if not 0 <= snapshots <= _native.MAX_SNAPSHOTS:
            raise InvalidArgument(f"snapshots must be in 0..{_native.MAX_SNAPSHOTS}, got {snapshots}")
        check_fits(g, file_tensors(self.file), context, kv, vram_free=free_memory(self.device), device=self.device,
                   resident=self.info.plan.vram["dense weights"], snapshots=snapshots)
        ple = PleRows(self.file, g) if g.ple_layers else None
        native = _native.DecodeSession(self.weights, self.pool.native, native_geometry(g), context=context,
                                       kv=kv, mode=mode, device=self.device, timeout=timeout, snapshots=snapshots)
        return Session(GpuEngine(native, ple, snapshots), self.tokenizer)

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
        plan=memory_plan(file.geometry, file_tensors(file), kv_page_tokens(), KV.INT8),
        warnings=tuple(file.warnings),
    )


def load(path: str | os.PathLike[str], *, device: int = 0, threads: int | None = None,
         cache_dir: str | os.PathLike[str] | None = None, progress: bool = True) -> Model:
    """Validate, plan and load the GGUF at `path` onto GPU `device` and the host's CPU pool.

    `cache_dir` keeps the repacked dense weights for the next load; `threads` sets the pool's workers
    (default: every physical core but the first).
    """
    file = inspect(path)
    try:
        info = describe(file)
        g = info.geometry
        # The model with its smallest session must fit before anything is allocated.
        check_fits(g, file_tensors(file), kv_page_tokens(), KV.INT8, vram_free=free_memory(device), device=device,
                   host_available=available_ram_bytes())
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
