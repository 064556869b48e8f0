"""The one way tests open a native decode session (strata._native.DecodeSession) on a model strata.load opened,
and the PLE rows its steps take, as the GPU engine (strata.runtime) gathers them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from strata import _native
from strata.runtime.geometry import native_geometry
from strata.runtime.ple_rows import PleRows


def open_native_session(model, *, context: int, kv: str = "bf16", **options) -> _native.DecodeSession:
    """A session over `model`'s VRAM weights and CPU pool with the geometry the runtime hands the native side;
    `options` (mode, snapshots, cache, staging, ...) as DecodeSession takes them. The caller closes it."""
    return _native.DecodeSession(model.weights, model.pool.native, native_geometry(model.info.geometry),
                                 context=context, kv=kv, **options)


def ple_rows(model) -> Callable[[int], np.ndarray | None]:
    """Each next token's n-gram table rows (None for a model without PLE), as the GPU engine gathers them."""
    g = model.info.geometry
    if not g.ple_layers:
        return lambda token: None
    return PleRows(model.file, g).rows


GREEDY = (0.0, 0, 1.0, 0.0, 1.0)  # DecodeSession's sampling values of greedy decoding


def stepped_logits(native: _native.DecodeSession, model, ids) -> np.ndarray:
    """The logits after each of `ids`, stepped one by one (none sampled)."""
    ple = ple_rows(model)
    out = []
    for t in ids:
        native.step(int(t), ple(int(t)), GREEDY, 0.0, sample=False)
        out.append(native.logits())
    return np.array(out)


def whole_cache(model) -> _native.ExpertCache:
    """A VRAM cache of every routed expert: a step's routing then stays on the device, and graph modes capture it."""
    g = model.info.geometry
    cache = _native.ExpertCache(model.pool.native, [g.n_expert] * g.n_layer, 0, {},
                                host_weights=model.pool.host_weights())
    for layer in range(g.n_layer):
        cache.hold(layer, list(range(g.n_expert)))
    return cache


def half_cache(model) -> _native.ExpertCache:
    """A VRAM cache of the first half of every layer's routed experts: a step then hands the rest to the CPU pool
    (decode through its doorbell, a step of several rows through the step's)."""
    g = model.info.geometry
    half = g.n_expert // 2
    cache = _native.ExpertCache(model.pool.native, [half] * g.n_layer, 0, {}, host_weights=model.pool.host_weights())
    for layer in range(g.n_layer):
        cache.hold(layer, list(range(half)))
    return cache
