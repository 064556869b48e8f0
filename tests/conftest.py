"""Test configuration: `gpu` tests run only where a CUDA device exists.

The decision is made from strata._native.device_count() alone: never by matching error strings, and an
out-of-memory error inside a GPU test is a failure, not a skip.
"""

from __future__ import annotations

import numpy as np
import pytest


def _device_count() -> int:
    from strata import _native

    return _native.device_count()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    if _device_count() > 0:
        return
    skip = pytest.mark.skip(reason="no CUDA device (strata._native.device_count() == 0)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A fresh random generator per test; its seed is printed on failure (see -ra / the report)."""
    seed = int(np.random.SeedSequence().entropy % (2**32))
    request.node.user_properties.append(("seed", seed))
    print(f"seed={seed}")
    return np.random.default_rng(seed)
