"""strata.load: a model file opened on the engine asked for. "gpu" (the default) loads it onto a GPU and the
host's CPU pool (strata.runtime); "reference" opens it for the numpy reference on the CPU: exact and slow, for
small models and for checking, and the way to run without a GPU."""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any

from strata.errors import InvalidArgument
from strata.format import ModelFile, inspect
from strata.generation import Session, session_context

ENGINES = ("gpu", "reference")


def load(path: str | os.PathLike[str], *, engine: str = "gpu", **options: Any):
    """Open the GGUF at `path` for `engine`: a strata.Model ("gpu"; options: device, threads, cache_dir,
    progress, expert_cache, cache_policy, vram_limit, prompt) or a ReferenceModel ("reference"). Both have `session(...)`, `tokenizer` and `close()`."""
    if engine == "gpu":
        from strata.runtime.model import load as load_on_gpu

        return load_on_gpu(path, **options)
    if engine == "reference":
        if options:
            raise InvalidArgument(f"the reference engine takes no {', '.join(sorted(options))} option")
        return ReferenceModel(inspect(path))
    raise InvalidArgument(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")


class ReferenceModel:
    """A model file run by the numpy reference on the CPU."""

    def __init__(self, file: ModelFile):
        self.file = file

    @property
    def tokenizer(self):
        """The file's tokenizer (strata.format.Tokenizer): encode, decode, count, the chat template."""
        return self.file.tokenizer()

    def session(self, context: int | None = None, snapshots: int | None = None, defer_experts: int = 0) -> Session:
        """A generation session of `context` tokens (default min(context_length, 4096)) on the reference; with
        `defer_experts`, expert deferral as the GPU engine's (docs/session.md, "Expert deferral")."""
        from strata.reference import Reference
        from strata.reference.engine import SNAPSHOTS, ReferenceEngine

        context = session_context(context, self.file.geometry.context_length)
        engine = ReferenceEngine(Reference(self.file, defer_experts=defer_experts), context,
                                 SNAPSHOTS if snapshots is None else snapshots)
        return Session(engine, self.tokenizer)

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> ReferenceModel:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
