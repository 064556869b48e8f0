"""The geometry the native core reads (cuda/include/strata/geometry.hpp, ModelGeometry): sizes and the flags of
the architecture's variant, as a plain dict built from a strata.models.Geometry. No architecture name crosses."""

from __future__ import annotations

from typing import Any

from strata.models import Geometry


def native_geometry(g: Geometry) -> dict[str, Any]:
    """Every field the binding exports (ModelGeometry's, which carry strata.models.Geometry's names), read from g;
    those the core holds in its own form: compress_ratios per layer as the indexer reads them (empty without
    indexed attention), ple_layer (-1: none) and ple_n_heads (0 without a PLE layer)."""
    from strata import _native  # the extension is optional for `import strata`; the core's geometry needs it

    core_form = {
        "compress_ratios": [g.qsa_ratio(layer) for layer in range(g.n_layer)] if g.qsa_block else [],
        "ple_layer": g.ple_layers[0] if g.ple_layers else -1,
        "ple_n_heads": g.ple_n_heads if g.ple_layers else 0,
    }
    return {name: core_form[name] if name in core_form else getattr(g, name) for name in _native.GEOMETRY_FIELDS}


def prompt_prefetch_rows(g: Geometry) -> int:
    """The native prompt path's rows rule for g (strata::prompt_prefetch_rows): a chunk of at least this many
    routed rows copies whole layers ahead; a smaller one may give the CPU pool a share, which needs a pool of
    this many max_rows."""
    from strata import _native  # the extension is optional for `import strata`; the rule is the core's

    return _native.prompt_prefetch_rows(native_geometry(g))


def pool_group_rows(g: Geometry) -> int:
    """The rows the CPU pool's grouped calls hold (its max_rows) under a prompt path: a prompt chunk's share below
    prompt_prefetch_rows, and a step of several rows' routed rows (MAX_STEP_ROWS x k), which its doorbell hands the
    pool in one call (ExpertPool.run_rows_sum)."""
    from strata import _native

    return max(prompt_prefetch_rows(g), _native.MAX_STEP_ROWS * g.n_expert_used)
