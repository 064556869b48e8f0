"""The GPU engine: strata.generation.Engine over the native decode session (strata._native.DecodeSession).

The native session runs one token per `step` (all layers on the GPU, routed experts on the CPU pool, the
sampler on the device) and keeps every id it was fed, so the repetition penalty's history lives there; this
side only checks that the caller's history agrees, and hands the PLE layer each token's n-gram table rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from strata.errors import InvalidArgument, StrataError
from strata.kv import KV

# Only what the CLI's parser needs is imported at module level: `strata doctor` and `--help` stay fast.
if TYPE_CHECKING:
    import numpy as np

    from strata.generation import Session
    from strata.model import Model
    from strata.ple_rows import PleRows
    from strata.sampling import SamplingParams

MODES = ("uncaptured", "layer_graphs", "token_graph")
DEFAULT_CONTEXT = 4096


@dataclass(frozen=True)
class Graphs:
    """How a GPU session runs its tokens: `mode`, whether its CUDA graphs are `captured` (on the first step),
    and `timing`: seconds per token of each stage, averaged since the session started or was reset (ring
    wait = the GPU's work before each router; gpu_pre / gpu_post only in mode "uncaptured", from CUDA
    events; host = the rest of the step)."""

    mode: str
    captured: bool
    tokens: int
    timing: dict[str, float]


class GpuEngine:
    """strata.generation.Engine over a DecodeSession (`native`), with `ple` rows when the model has PLE."""

    def __init__(self, native: Any, ple: PleRows | None = None):
        self.native, self.ple = native, ple

    @property
    def context(self) -> int:
        return self.native.context

    @property
    def position(self) -> int:
        return self.native.position

    @property
    def mode(self) -> str:
        return self.native.mode

    def feed(self, ids: Sequence[int], params: SamplingParams, u: float, seen: Sequence[int]) -> int:
        """Step every id; only the last one samples (the earlier ones only fill the state)."""
        if not ids:
            raise InvalidArgument("feed() needs at least one token id")
        if len(seen) != self.position + len(ids):
            raise StrataError(f"the history passed as `seen` has {len(seen)} ids, but the session holds "
                              f"{self.position} and is fed {len(ids)}: the native session keeps the same "
                              "history, so the two would disagree")
        sampling = (params.temperature, params.top_k, params.top_p, params.min_p, params.repeat_penalty)
        token = -1
        for i, token_id in enumerate(ids):
            rows = self.ple.rows(int(token_id)) if self.ple is not None else None
            token = self.native.step(int(token_id), rows, sampling, u, sample=i == len(ids) - 1)
        return token

    def logits(self) -> np.ndarray:
        """float32 [n_vocab] of the last step."""
        return self.native.logits()

    def reset(self) -> None:
        self.native.reset()
        if self.ple is not None:
            self.ple.reset()

    @property
    def graphs(self) -> Graphs:
        st = self.native.stats()
        n = max(st["tokens"], 1)
        stages = ("ring_wait_seconds", "pool_seconds", "gpu_pre_seconds", "gpu_post_seconds")
        timing = {key.removesuffix("_seconds"): st[key] / n for key in stages}
        timing["host"] = max(st["seconds"] / n - timing["ring_wait"] - timing["pool"], 0.0)
        return Graphs(self.native.mode, self.native.captured, st["tokens"], timing)

    def stats(self) -> dict[str, float]:
        """The native session's sums since construction or reset (tokens, seconds, ring wait, pool, gpu)."""
        return self.native.stats()

    def close(self) -> None:
        self.native.close()


def check_session_fits(model: Model, context: int, kv: KV, device: int) -> None:
    """Refuse a context whose session state does not fit next to the loaded model on `device`.

    The dense weights are already in VRAM (they are part of the plan but no longer part of the free memory),
    so the plan is asked for the largest context that fits in the free memory plus the dense weights.
    """
    from strata.devices import free_memory
    from strata.plan import GIB, file_tensors, largest_context

    free = free_memory(device)
    tensors = file_tensors(model.file)
    budget = free + model.info.plan.vram["dense weights"]
    fits = largest_context(model.info.geometry, tensors, kv, budget)
    if context > fits:
        other = [f"context <= {largest_context(model.info.geometry, tensors, k, budget)} with kv={k.value}"
                 for k in KV if k is not kv]
        raise InvalidArgument(f"a session of context {context} with kv={kv.value} does not fit: GPU {device} has "
                              f"{free / GIB:.2f} GiB free, which holds context <= {fits} ({', '.join(other)})")


def open_session(model: Model, context: int | None = None, kv: KV | str = KV.INT8, mode: str = "token_graph",
                 timeout: float = 5.0, device: int = 0) -> Session:
    """A generation Session on a GpuEngine over a new native DecodeSession of `model` (see Model.session)."""
    from strata.generation import Session
    from strata.ple_rows import PleRows
    from strata.session_geometry import native_geometry

    g = model.info.geometry
    kv = KV.parse(kv)
    if mode not in MODES:
        raise InvalidArgument(f"unknown session mode {mode!r}; choose one of {', '.join(MODES)}")
    if not timeout > 0:
        raise InvalidArgument(f"timeout must be > 0 seconds, got {timeout}")
    context = min(g.context_length, DEFAULT_CONTEXT) if context is None else int(context)
    if not 1 <= context <= g.context_length:
        raise InvalidArgument(f"context {context} is outside 1..{g.context_length} (the model's context_length)")
    check_session_fits(model, context, kv, device)
    ple = PleRows(model.file, g) if g.arch == "qwen4exp" and g.ple_layers else None
    from strata import _native  # the extension is optional for `import strata`; a session needs it

    if not hasattr(_native, "DecodeSession"):
        raise StrataError("this build of strata has no native decode session (strata._native.DecodeSession)")
    native = _native.DecodeSession(model.weights, model.pool.native, native_geometry(g), context=context,
                                   kv=kv.value, mode=mode, device=device, timeout=timeout)
    return Session(GpuEngine(native, ple), model.file.tokenizer())
