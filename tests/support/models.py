"""Tiny synthetic models (strata.synth) that several test files load, each file written once per test session
and shared: the `tiny_model` fixture of tests/conftest.py. Loading never writes to a model file."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from strata.synth import synthesize


class TinyModels:
    """tiny_model(arch, seed=, types=, preset=): the path of that synthetic model, written on first use."""

    def __init__(self, factory: pytest.TempPathFactory):
        self._factory = factory
        self._made: dict[tuple, Path] = {}

    def __call__(self, arch: str, *, seed: int, types: Mapping[str, str] | str | None = None,
                 preset: str = "tiny") -> Path:
        key = (arch, preset, seed, repr(types))
        if key not in self._made:
            path = self._factory.mktemp(f"{arch}-{preset}-seed{seed}") / "model.gguf"
            self._made[key] = synthesize(path, arch, preset, types=types, seed=seed)
        return self._made[key]
