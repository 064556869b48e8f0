"""strata.load: a model file opened on the engine asked for. "gpu" (the default) loads it onto a GPU and the
host's CPU pool (strata.runtime); "reference" opens it for the numpy reference on the CPU: exact and slow, for
small models and for checking, and the way to run without a GPU."""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from strata.errors import InvalidArgument, StrataError
from strata.format import ModelFile, inspect
from strata.generation import Session, session_context
from strata.generation.arguments import checked_integer
from strata.generation.drafts import DEFAULT_DRAFT_TOKENS, named_drafter, verify_rows

ENGINES = ("gpu", "reference")
# strata.Model.session's options that only the GPU engine has: refused by name on the reference
GPU_SESSION_OPTIONS = ("mode", "timeout", "prompt_chunk", "prompt_cpu", "kv_streaming")


def load(path: str | os.PathLike[str], *, engine: str = "gpu", **options: Any):
    """Open the GGUF at `path` for `engine`: a strata.Model ("gpu"; options: device, threads, cache_dir,
    progress, expert_cache, cache_policy, vram_limit, prompt, ram_budget) or a ReferenceModel ("reference"). Both
    have `session(...)`, `tokenizer` and `close()`."""
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgument(f"path must be a file path (str or os.PathLike), got {type(path).__name__}")
    if engine == "gpu":
        from strata.runtime.model import load as load_on_gpu

        return load_on_gpu(path, **options)
    if engine == "reference":
        if options:
            raise InvalidArgument(f"the reference engine takes no {', '.join(sorted(options))} option")
        return ReferenceModel(inspect(path))
    raise InvalidArgument(f"unknown engine {engine!r:.80}; choose one of {', '.join(ENGINES)}")


class ReferenceModel:
    """A model file run by the numpy reference on the CPU."""

    def __init__(self, file: ModelFile):
        self.file = file
        self.closed = False

    @property
    def tokenizer(self):
        """The file's tokenizer (strata.format.Tokenizer): encode, decode, count, the chat template."""
        return self.file.tokenizer()

    def session(self, context: int | None = None, *, kv: Any = None, snapshots: int | None = None,
                defer_experts: int = 0, draft: str | None = None, draft_tokens: int = DEFAULT_DRAFT_TOKENS,
                control_vectors: Sequence[tuple[str | os.PathLike[str], float]] = (),
                control_layers: tuple[int, int] | None = None, **gpu_options: Any) -> Session:
        """A generation session of `context` tokens (default min(context_length, 4096)) on the reference. With
        `kv`, the attention caches hold their rows in that format, as a GPU session's (default: as computed);
        `snapshots` states are kept for prefix reuse (default 4); with `defer_experts`, expert deferral as the
        GPU engine's (docs/session.md, "Expert deferral"). With `draft` ("lookup", "auto" which is lookup, or "mtp":
        the file's MTP block, strata.reference.mtp), each decode step verifies up to `draft_tokens` (1..7) drafted
        tokens at once (strata.generation.drafts), the output unchanged. `control_vectors`, (path, scale) pairs of
        llama.cpp control-vector files, are summed and added to each layer's output, on the layers of
        `control_layers` (start, end inclusive; default all), as llama.cpp's --control-vector-scaled and
        --control-vector-layer-range (docs/control_vectors.md); `session.set_control_vectors` changes them between
        turns. The GPU engine's other options are refused by name."""
        from strata.control_vectors import steering_table
        from strata.reference import Reference
        from strata.reference.engine import SNAPSHOTS, ReferenceEngine
        from strata.reference.mtp import MtpDrafter, MtpReference

        for name in gpu_options:
            if name in GPU_SESSION_OPTIONS:
                raise InvalidArgument(f"{name}: the reference engine's session has no such option (GPU engine only)")
            raise InvalidArgument(f"unknown session option {name!r}; the reference engine's session takes context, "
                                  "kv, snapshots, defer_experts, draft, draft_tokens, control_vectors and "
                                  "control_layers")
        if self.closed:
            raise StrataError("this model is closed: it opens no new sessions")
        context = session_context(context, self.file.geometry.context_length)
        snapshots = SNAPSHOTS if snapshots is None else checked_integer("snapshots", snapshots)
        if snapshots < 0:
            raise InvalidArgument(f"snapshots must be >= 0, got {snapshots}")
        steering = steering_table(control_vectors, self.file.geometry, control_layers)
        reference = Reference(self.file, kv=kv, defer_experts=defer_experts,  # kv: a strata.KV or its name
                              control_vectors=steering)
        if draft == "mtp":
            reference = MtpReference(reference, kv)  # refused where the file has no block it runs
        drafter = named_drafter(draft, draft_tokens, mtp=lambda: MtpDrafter(reference))
        geometry = self.file.geometry
        engine = ReferenceEngine(reference, context, snapshots, verify_rows(drafter, draft_tokens),
                                 steering=lambda vectors, layers: steering_table(vectors, geometry, layers))
        return Session(engine, self.tokenizer, drafter, draft_tokens if drafter else 0)

    def close(self) -> None:
        self.closed = True
        self.file.close()

    def __enter__(self) -> ReferenceModel:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
