"""Bounded fuzzing of inspect(): mutated or truncated valid files either open or raise FormatError."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from malformed import build_tiny
from strata.errors import FormatError
from strata.format import inspect

FUZZ = settings(max_examples=200, deadline=2000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, int]:
    path = build_tiny(tmp_path_factory.mktemp("fuzz") / "base.gguf", np.random.default_rng(1234))
    blob = path.read_bytes()
    with inspect(path) as mf:
        header_end = mf.data_start       # mutations aim at the structures, not at tensor bytes
    return path.parent, blob, header_end


def _check(directory: Path, blob: bytes) -> None:
    path = directory / "case.gguf"
    path.write_bytes(blob)
    try:
        with inspect(path) as mf:
            for name in list(mf.tensors)[:3]:
                mf.raw(name)
    except FormatError:
        pass


@FUZZ
@given(data=st.data())
def test_mutated_bytes(base: tuple[Path, bytes, int], data: st.DataObject) -> None:
    directory, blob, header_end = base
    mutable = bytearray(blob)
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, header_end - 1))
        mutable[at] = data.draw(st.integers(0, 255))
    _check(directory, bytes(mutable))


@FUZZ
@given(cut=st.integers(0, 1 << 20))
def test_truncated(base: tuple[Path, bytes, int], cut: int) -> None:
    directory, blob, header_end = base
    _check(directory, blob[:cut % (header_end + 64)])
