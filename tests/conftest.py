"""Test configuration: `gpu` tests run only where a CUDA device exists, `hooks` tests only where the test hooks
(strata._native_check) are built.

Each decision is made from one fact: strata._native.device_count(), and whether the hooks' module exists
(support.hooks.available); never by matching error strings, and an out-of-memory error inside a GPU test is a
failure, not a skip.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from support import hooks
from support.models import TinyModels


def _device_count() -> int:
    from strata import _native

    return _native.device_count()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _skip_where_absent(items, "gpu", lambda: _device_count() > 0,
                      "no CUDA device (strata._native.device_count() == 0)")
    _skip_where_absent(items, "hooks", hooks.available, hooks.ABSENT)


def _skip_where_absent(items: list[pytest.Item], marker: str, present: Callable[[], bool], reason: str) -> None:
    """Skip the items carrying `marker` unless `present()`, which is asked only when some item carries it."""
    marked = [item for item in items if item.get_closest_marker(marker)]
    if not marked or present():
        return
    for item in marked:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    """Tiny synthetic model files that several test files load, each written once per session (support.models)."""
    return TinyModels(tmp_path_factory)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A fresh random generator per test; its seed is printed on failure (see -ra / the report)."""
    seed = int(np.random.SeedSequence().entropy % (2**32))
    request.node.user_properties.append(("seed", seed))
    print(f"seed={seed}")
    return np.random.default_rng(seed)
