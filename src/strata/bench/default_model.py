"""The default benchmark model: qwen4exp's `bench` preset at 16 layers, synthesized once into the user cache."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

BENCH_ARCH, BENCH_PRESET, BENCH_LAYERS = "qwen4exp", "bench", 16


def cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """$STRATA_CACHE, else $XDG_CACHE_HOME/strata, else ~/.cache/strata."""
    if environ.get("STRATA_CACHE"):
        return Path(environ["STRATA_CACHE"])
    if environ.get("XDG_CACHE_HOME"):
        return Path(environ["XDG_CACHE_HOME"]) / "strata"
    return Path.home() / ".cache" / "strata"


def bench_model(cache: Path, synthesize: Callable[..., Any], progress: Callable[[int, int], None] | None = None
                ) -> Path:
    """The default benchmark model in `cache`, synthesized there first if absent (said on stderr, as load's
    progress is). `synthesize` (strata.synth's) writes it under a temporary name and renames it when complete, so
    an interrupted synth is never taken for the model, and removes what killed writes to that name left."""
    path = cache / f"{BENCH_ARCH}-{BENCH_PRESET}-{BENCH_LAYERS}L.gguf"
    if path.is_file():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    print(f"bench: synthesizing the default benchmark model into {path} (about 26 GB, once)", file=sys.stderr)
    synthesize(path, BENCH_ARCH, preset=BENCH_PRESET, n_layer=BENCH_LAYERS, progress=progress)
    return path
