"""strata.load: a model file made ready to run, each part where it lives (architecture.md, 'What lives where'),
and Model.session: a generation session on the GPU engine.

Before anything is allocated the memory plan is checked against the GPU's free memory and the host's RAM
budget; what does not fit is refused with the numbers. Then the dense weights go to one VRAM arena and the
routed experts, repacked once, to the CPU pool (or, where the RAM budget does not hold them, to its disk tier:
strata.runtime.tiers), and as many of them as the expert cache's budget holds to VRAM
(strata.runtime.expert_cache); the n-gram table's rows are read from the file as tokens need them.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from strata.devices import free_memory
from strata.errors import InvalidArgument, OutOfMemory, StrataError
from strata.format import ModelFile, inspect
from strata.generation import Session, session_context
from strata.generation.arguments import checked_flag, checked_integer, checked_number
from strata.generation.drafts import DEFAULT_DRAFT_TOKENS, named_drafter, verify_rows
from strata.models import Geometry
from strata.options import (
    DEFAULT_CACHE_POLICY, DEFAULT_EXPERT_CACHE, DEFAULT_KV, DEFAULT_MODE, DEFAULT_SNAPSHOTS, DEFAULT_TIMEOUT, KV, Mode,
    check_defer_experts,
)
from strata.progress import ByteProgress
from strata.runtime import expert_cache as cache_plan
from strata.runtime import prompt as prompt_plan
from strata.runtime.engine import GpuEngine
from strata.runtime.geometry import native_geometry, pool_group_rows
from strata.runtime.host import available_ram_bytes
from strata.runtime.loader import load_experts, upload_dense
from strata.runtime.placement import ExpertPlacement, place_experts
from strata.runtime.plan import (
    GIB, MemoryPlan, can_stream, check_fits, file_tensors, kv_page_tokens, largest_context,
    memory_plan,
)
from strata.runtime import tiers
from strata.runtime.ple_rows import PleRows
from strata.runtime.pool import ExpertPool
from strata.runtime.steering import ControlVectors
from strata.runtime.tiers import RamPlan, plan_ram

@dataclass(frozen=True)
class ModelInfo:
    arch: str
    geometry: Geometry
    tensor_types: dict[str, int]  # GGML type name -> tensor count
    plan: MemoryPlan  # the model's parts with the smallest session (one KV page)
    warnings: tuple[str, ...]


class Model:
    """A loaded model: `info`, the dense weights in VRAM, the routed experts in the CPU pool and `cache` (a
    strata._native.ExpertCache, or None) the ones in VRAM, `cache_slots` of each layer's, and `staging` (a
    strata._native.ExpertStaging, or None) the prompt path's. `vram_limit` caps the VRAM the model's plan may take
    (None: the GPU's free memory)."""

    def __init__(self, file: ModelFile, info: ModelInfo, weights, pool: ExpertPool, device: int = 0, cache=None,
                 cache_slots: list[int] | None = None, vram_limit: int | None = None, staging=None,
                 ram: RamPlan | None = None):
        self.file, self.info, self.weights, self.pool, self.device = file, info, weights, pool, device
        self.cache, self.vram_limit, self.staging, self.ram = cache, vram_limit, staging, ram
        self.cache_slots = cache_slots or [0] * info.geometry.n_layer

    @property
    def cache_bytes(self) -> int:
        """VRAM the expert cache holds."""
        return self.cache.bytes if self.cache is not None else 0

    @property
    def staging_bytes(self) -> int:
        """VRAM the prompt path's staging holds."""
        return self.staging.bytes if self.staging is not None else 0

    @property
    def prompt_path(self) -> bool:
        """Whether sessions run prompts in chunks: the staging exists, or the cache holds every routed expert."""
        return self.staging is not None or (self.cache is not None
                                            and cache_plan.holds_every_expert(self.pool, self.cache_slots))

    @property
    def tokenizer(self):
        """The file's tokenizer (strata.format.Tokenizer): encode, decode, count, the chat template."""
        return self.file.tokenizer()

    def session(self, context: int | None = None, *, kv: KV | str = DEFAULT_KV, mode: Mode | str = DEFAULT_MODE,
                timeout: float = DEFAULT_TIMEOUT, snapshots: int = DEFAULT_SNAPSHOTS, prompt_chunk: int | None = None,
                prompt_cpu: bool = True, kv_streaming: bool = False, defer_experts: int = 0, draft: str | None = None,
                draft_tokens: int = DEFAULT_DRAFT_TOKENS, control_vectors: Sequence[tuple[str, float]] = (),
                control_layers: tuple[int, int] | None = None) -> Session:
        """A generation session on the GPU: `context` tokens (default min(context_length, 4096)) of KV in
        format `kv`; `mode` says how a token is launched (strata.Mode); `timeout` bounds every wait on the CPU
        pool; `snapshots` states are kept for prefix reuse (the turn boundaries a conversation rolls back to).
        Prompts run in chunks of `prompt_chunk` tokens (default strata.runtime.prompt.DEFAULT_CHUNK, halved
        while it does not fit; 0: token by token) where the model has a prompt path; with `prompt_cpu`, the CPU
        pool computes a share of a small chunk's routed experts beside the staging. With `kv_streaming`, the
        attention layers' KV lives in page-locked host memory and VRAM holds only the QSA blocks each token reads
        (docs/session.md, "KV streaming"; qwen4exp's indexed attention only). With `defer_experts` d > 0 (below
        n_expert_used), the CPU pool's d lightest routed experts of every layer but the last reach the streams one
        layer late, computed while the GPU runs the next layer: faster, no longer exact (docs/session.md, "Expert
        deferral"; token by token only, the prompt path stays exact). With `draft` ("lookup", or "auto" which is
        lookup; "mtp" runs on the reference engine only, for now), each decode step verifies up to `draft_tokens`
        (1..7) drafted tokens in one pass of the prompt path, which it needs (strata.generation.drafts).
        `control_vectors`, (path, scale) pairs of llama.cpp control-vector files, are summed and added to each layer's
        output on the layers of `control_layers` (start, end inclusive; default all), as the reference engine's
        (ReferenceModel.session, docs/control_vectors.md), in every path and mode; `session.set_control_vectors`
        changes them between turns. The native session is `session.engine.native`. Every option after `context` is
        keyword-only, as on the reference engine."""
        if self.weights is None:
            raise StrataError("this model is closed: it opens no new sessions")
        g = self.info.geometry
        controls = ControlVectors(g)
        # the files read and checked before the GPU is touched
        steering = controls.table(control_vectors, control_layers)
        kv, mode = KV.parse(kv), Mode.parse(mode)
        if not checked_number("timeout", timeout) > 0:
            raise InvalidArgument(f"timeout must be > 0 seconds, got {timeout}")
        context = session_context(context, g.context_length)
        check_defer_experts(defer_experts, g.n_expert_used)
        checked_flag("prompt_cpu", prompt_cpu)
        checked_flag("kv_streaming", kv_streaming)
        if prompt_chunk is not None and checked_integer("prompt_chunk", prompt_chunk) < 0:
            raise InvalidArgument(f"prompt_chunk must be >= 0 (0: token by token; None: the default), "
                                  f"got {prompt_chunk}")
        drafter = named_drafter(draft, draft_tokens)
        if drafter is not None and prompt_chunk == 0:
            raise InvalidArgument(f"draft {draft!r} needs the prompt path, which verifies the drafts: "
                                  "prompt_chunk=0 turns it off")
        from strata import _native  # the extension is optional for `import strata`; a session needs it

        if not 0 <= checked_integer("snapshots", snapshots) <= _native.MAX_SNAPSHOTS:
            raise InvalidArgument(f"snapshots must be in 0..{_native.MAX_SNAPSHOTS}, got {snapshots}")
        tensors = file_tensors(self.file)
        resident, free = self._vram_room()
        placed = {"expert_cache": self.cache_bytes, "prompt_staging": self.staging_bytes}
        if kv_streaming and not can_stream(g):
            raise InvalidArgument(f"kv_streaming: {g.arch}'s attention layers have no QSA indexer, so every token "
                                  "reads all of their KV and it must stay in VRAM (KV streaming serves qwen4exp)")
        host_resident = self.info.plan.host_total  # the experts and pinned buffers, in place since load
        rows = verify_rows(drafter, draft_tokens)
        tiers = self.ram.tier_bytes if self.ram is not None else None
        plan = check_fits(g, tensors, context, kv, vram_free=free, device=self.device, resident=resident, tiers=tiers,
                          snapshots=snapshots + rows, kv_streaming=kv_streaming, host_resident=host_resident,
                          host_available=available_ram_bytes() if kv_streaming else None, **placed)
        chunk = 0
        if self.prompt_path and prompt_chunk != 0:
            chunk = prompt_plan.fitting_chunk(g, context, free - (plan.vram_total - resident), prompt_chunk, kv,
                                              kv_streaming)
        if drafter is not None and chunk < rows:
            raise InvalidArgument(f"draft {draft!r} needs the prompt path, which verifies the drafts in one chunk of "
                                  f"{rows} tokens; " + ("this model has none (loaded with prompt=False, or its "
                                  "staging did not fit)" if chunk == 0 else f"the chunk that fits is {chunk}"))
        ple = PleRows(self.file, g) if g.ple_layers else None
        gather = ple.native() if ple is not None else None  # the session gathers the rows itself where it can
        native = _native.DecodeSession(self.weights, self.pool.native, native_geometry(g), context=context,
                                       kv=kv, mode=mode, device=self.device, timeout=timeout, snapshots=snapshots,
                                       cache=self.cache, prompt_chunk=chunk, staging=self.staging,
                                       prompt_cpu=prompt_cpu, kv_streaming=kv_streaming,
                                       defer_experts=defer_experts, ple=gather,
                                       verify_rows=rows)
        # which sessions step together: the native session's one definition (docs/rows.md)
        engine = GpuEngine(native, ple if gather is None else None, snapshots, native.batch_key, controls)
        if steering:
            try:
                engine.set_steering(steering)
            except BaseException:
                native.close()
                raise
        return Session(engine, self.tokenizer, drafter, draft_tokens if drafter else 0)

    def _vram_room(self) -> tuple[int, int]:
        """(the VRAM the model holds: dense weights, expert cache, prompt staging; what is free for a session beside
        it, within vram_limit)."""
        resident = self.info.plan.vram["dense weights"] + self.cache_bytes + self.staging_bytes
        return resident, vram_free(self.device, self.vram_limit, resident)

    def largest_context(self, kv: KV | str = DEFAULT_KV, kv_streaming: bool = False,
                        snapshots: int = DEFAULT_SNAPSHOTS) -> int:
        """The longest context (whole KV pages, at most the model's) a session in `kv`, streamed or not, with
        `snapshots` state slots can open now: what the GPU has free beside the model (within vram_limit), by the
        memory plan; 0 if none fits."""
        g, kv = self.info.geometry, KV.parse(kv)
        if kv_streaming and not can_stream(g):
            return 0
        resident, free = self._vram_room()
        return largest_context(g, file_tensors(self.file), kv, free + resident, snapshots, self.cache_bytes,
                               self.staging_bytes, kv_streaming=kv_streaming)

    def close(self) -> None:
        self.cache = self.staging = None  # both point into the pool's host weights: gone first
        self.pool.close()
        self.weights = None
        self.file.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def describe(file: ModelFile, plan: MemoryPlan | None = None) -> ModelInfo:
    """The model's facts, with `plan` its memory plan with the smallest session where the caller has it already."""
    return ModelInfo(
        arch=file.arch,
        geometry=file.geometry,
        tensor_types=dict(Counter(info.ggml_type.name for info in file.tensors.values())),
        plan=plan or memory_plan(file.geometry, file_tensors(file), kv_page_tokens(), DEFAULT_KV),
        warnings=tuple(file.warnings),
    )


def vram_free(device: int, vram_limit: int | None, placed: int) -> int:
    """VRAM still free for the model on `device`: the GPU's free memory, within `vram_limit` beyond the `placed`
    bytes the model already holds there."""
    free = free_memory(device)
    return free if vram_limit is None else min(free, vram_limit - placed)


def prompt_staging(placed: ExpertPlacement, pool: ExpertPool, device: int, n_expert: int, progress: bool):
    """The prompt path's staging of a whole layer (`n_expert`) per buffer as `placed` says, else None (said on
    stderr with `progress`)."""
    need, free = placed.staging_bytes / GIB, placed.staging_free / GIB
    if not placed.staged:
        if progress:
            print(f"load: no prompt path: its staging needs {need:.2f} GiB, {free:.2f} GiB are free "
                  "beside the smallest session; prompts step token by token", file=sys.stderr)
        return None
    if progress:
        print(f"load: prompt staging {need:.2f} GiB (2 x {n_expert} experts)", file=sys.stderr)
    return prompt_plan.build_staging(pool, device, n_expert)


def load(path: str | os.PathLike[str], *, device: int = 0, threads: int | None = None,
         cache_dir: str | os.PathLike[str] | None = None, progress: bool = True,
         expert_cache: cache_plan.Budget = DEFAULT_EXPERT_CACHE, vram_limit: cache_plan.Budget | None = None,
         cache_policy: str = DEFAULT_CACHE_POLICY, prompt: bool = True,
         ram_budget: cache_plan.Budget = "auto") -> Model:
    """Validate, plan and load the GGUF at `path` onto GPU `device` and the host's CPU pool.

    `cache_dir` keeps the repacked dense weights for the next load; `threads` sets the pool's workers
    (default: every physical core but the first). `expert_cache` is the VRAM budget for routed experts:
    "auto" (what the GPU has free beside the default session and a reserve), bytes (an int or "24G"), or 0
    (every routed expert on the CPU); `cache_policy` whether routing replaces the experts a partial cache holds
    ("lfru") or not ("static"). `vram_limit` caps the VRAM the model and its sessions may take, as on a
    smaller card (bytes or "16G"; None: the whole GPU). With `prompt`, prompts run in chunks on the GPU
    (docs/prompt.md): unless the cache holds every routed expert, the prompt path's staging takes two layers'
    worth of experts of VRAM, and is left out (prompts step token by token) where the smallest session would
    not fit beside it. `ram_budget` is the host RAM the model may keep ("auto": what the machine can spare, the
    plan says how much; bytes or "16G"): where the routed experts do not fit in it, the CPU pool keeps what it holds
    of them and reads the rest from the file as decoding routes them (docs/tiers.md); the VRAM cache then reads its
    experts through the pool once, at load, and holds them static, and the prompt staging (whole layers) is off.
    """
    budget = cache_plan.parse_budget(expert_cache)  # a bad budget or policy is refused before the long work
    ram_limit = cache_plan.parse_budget(ram_budget, "ram_budget")
    cache_plan.policy_options(cache_policy)
    limit = None if vram_limit is None else cache_plan.parse_budget(vram_limit)
    if vram_limit is not None and limit is None:
        raise InvalidArgument("vram_limit must be a byte count or a size such as '24G', not 'auto'")
    file = inspect(path)
    try:
        g, tensors = file.geometry, file_tensors(file)
        ram = plan_ram(file, tiers.ram_budget(ram_limit))
        if ram.tiered:  # the cache reads a tiered layer's experts through the pool, once (docs/tiers.md)
            cache_policy = cache_plan.TIERED_POLICY
        # The model with its smallest session must fit before anything is allocated: the one plan of the load.
        smallest = check_fits(g, tensors, kv_page_tokens(), DEFAULT_KV, vram_free=vram_free(device, limit, 0),
                              device=device, host_available=ram.budget.nbytes, tiers=ram.tier_bytes)
        info = describe(file, smallest)
        if progress:
            print("\n".join(f"load: {line}" for line in ram.lines()), file=sys.stderr)
        dense_cache = None if cache_dir is None else os.path.join(cache_dir, os.path.basename(file.path) + ".dense")
        weights = upload_dense(file, device, dense_cache, ByteProgress("load: dense weights") if progress else None)
        # run_groups' rows: the prompt path's chunks and steps of several rows hand the pool grouped rows.
        pool = ExpertPool(g.n_embd, g.expert_ff, g.n_expert_used, threads=threads, pin_caller=False,
                          max_rows=pool_group_rows(g) if prompt else 0)
        try:
            load_experts(file, pool, ByteProgress("load: routed experts") if progress else None, ram)
            # The exact figures read the pool's planes, so the experts' placement is decided once they are in it.
            # A tiered load has no prompt staging: it copies whole layers (docs/tiers.md).
            placed = place_experts(g, tensors, info.plan, pool, budget,
                                   vram_free(device, limit, info.plan.vram["dense weights"]), device,
                                   prompt and not ram.tiered)
            slots = placed.cache_slots
            if progress:
                line = cache_plan.describe(g, tensors, slots, placed.cache_bytes)
                why = " (a tiered load's cache is read once: docs/tiers.md)" if ram.tiered and any(slots) else ""
                print(f"load: {line}, policy {cache_policy}{why}", file=sys.stderr)
            cache = cache_plan.build(pool, slots, device, cache_plan.expert_bytes(g, tensors),
                                     ByteProgress("load: expert cache") if progress else None, cache_policy)
            staging = prompt_staging(placed, pool, device, g.n_expert, progress) if placed.wants_staging else None
        except BaseException:
            pool.close()
            raise
        return Model(file, info, weights, pool, device, cache, slots, limit, staging, ram)
    except BaseException:
        file.close()
        raise
