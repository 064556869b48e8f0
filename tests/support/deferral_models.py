"""Tiny synthetic models for the expert deferral tests: the tiny preset routes 2 of its 8 experts, too few to
defer 3, so these route ROUTED of them (the same tensors: a routed tensor holds every expert)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import pytest

from strata.synth import presets, synthesize

ROUTED = 4


def synthesize_routing(path: Path, arch: str, types: Mapping[str, str] | None = None, seed: int = 0,
                       n_layer: int | None = None) -> Path:
    """synthesize(path, arch, "tiny", n_layer, types, seed) with n_expert_used = ROUTED."""
    tiny = presets.geometry

    def routing(*args, **kwargs):
        return dataclasses.replace(tiny(*args, **kwargs), n_expert_used=ROUTED)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(presets, "geometry", routing)
        return synthesize(path, arch, "tiny", n_layer, types=types, seed=seed)
