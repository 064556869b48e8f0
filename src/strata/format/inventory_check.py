"""Checks a file's tensors against its architecture's inventory: missing, extra, misshapen, wrong type."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Container, Mapping

from strata.errors import FormatError
from strata.format.scanner import TensorInfo
from strata.format.types import T
from strata.models import (Alternative, Geometry, TensorSpec, mtp_alternatives, mtp_inventory, mtp_optional, mtp_specs,
                           tensor_alternatives, tensor_inventory, validate)

_LISTED = 5     # names quoted in one message; the rest are counted


def squeeze(ne: tuple[int, ...]) -> tuple[int, ...]:
    """`ne` without trailing 1s: the shape compared with a spec's."""
    # ggml treats trailing 1s as absent ({2560} and {2560, 1} are the same tensor)
    while len(ne) > 1 and ne[-1] == 1:
        ne = ne[:-1]
    return ne


def _some(names: list[str]) -> str:
    more = f" and {len(names) - _LISTED} more" if len(names) > _LISTED else ""
    return ", ".join(repr(n) for n in names[:_LISTED]) + more


def with_file_ple_rows(g: Geometry, tensors: Mapping[str, TensorInfo]) -> Geometry:
    """The geometry with ple_rows taken from the file's n-gram table (its padding is the writer's choice)."""
    table = tensors.get("per_layer_token_embd.weight")
    if not g.ple_layers or table is None or len(table.ne) != 2:
        return g
    g = dataclasses.replace(g, ple_rows=table.ne[1])
    validate(g)      # the table must still cover every head's rows
    return g


def expected_specs(g: Geometry, present: Mapping[str, TensorInfo]) -> dict[str, TensorSpec]:
    """The inventory, with each accepted alternative (e.g. merged experts) swapped in where the file uses it."""
    return with_alternatives(tensor_inventory(g), tensor_alternatives(g), present)


def with_alternatives(inventory: list[TensorSpec], alternatives: list[Alternative],
                      present: Container[str]) -> dict[str, TensorSpec]:
    """`inventory` by name, each of `alternatives` swapped in where `present` (the names held) has it."""
    specs = {s.name: s for s in inventory}
    for alt in alternatives:
        if alt.spec.name not in present:
            continue
        both = [n for n in alt.replaces if n in present]
        if both:
            raise FormatError(f"tensor {alt.spec.name!r} replaces {_some(list(alt.replaces))}, but the file "
                              f"also holds {_some(both)}")
        for name in alt.replaces:
            del specs[name]
        specs[alt.spec.name] = alt.spec
    return specs


def check_mtp_block(g: Geometry, ne_of: Callable[[str], tuple[int, ...] | None]) -> None:
    """FormatError unless the MTP block strata runs (models.mtp_inventory, with its optional tensors and
    alternatives) is complete and well-formed, naming the tensor at fault; `ne_of(name)` is a tensor's ggml
    shape, None where it is absent."""
    inventory, alternatives, optional = mtp_inventory(g), mtp_alternatives(g), mtp_optional(g)
    named = [s.name for s in (*inventory, *optional)] + [alt.spec.name for alt in alternatives]
    held = {name for name in named if ne_of(name) is not None}
    specs = with_alternatives(inventory, alternatives, held)
    specs.update((s.name, s) for s in optional if s.name in held)
    for name, spec in specs.items():
        ne = ne_of(name)
        if ne is None:
            raise FormatError(f"{g.arch} MTP block: tensor {name!r} (ne {spec.ne}) is missing")
        if squeeze(ne) != squeeze(spec.ne):
            raise FormatError(f"{g.arch} MTP block: tensor {name!r}: expected ne {spec.ne}, found {ne}")


def check_tensors(g: Geometry, tensors: Mapping[str, TensorInfo], n_mtp_layers: int) -> list[str]:
    """FormatError on the first violation; returns warnings: MTP tensors no engine runs (blocks after the first,
    an architecture's block strata does not run, names outside the block), and a block that MTP drafts refuse
    (the main model still runs)."""
    specs = expected_specs(g, tensors)
    missing = [n for n in specs if n not in tensors]
    if missing:
        shown = ", ".join(f"{n!r} (ne {specs[n].ne})" for n in missing[:_LISTED])
        raise FormatError(f"{g.arch}: {len(missing)} required tensor(s) missing: {shown}")
    extra = [n for n in tensors if n not in specs]
    mtp = [n for n in extra if n_mtp_layers and _layer_of(n) is not None and _layer_of(n) >= g.n_layer]
    unexpected = [n for n in extra if n not in mtp]
    if unexpected:
        raise FormatError(f"{g.arch}: unexpected tensor(s) not in the architecture's inventory: {_some(unexpected)}")
    for name, s in specs.items():
        info = tensors[name]
        if squeeze(info.ne) != squeeze(s.ne):
            raise FormatError(f"tensor {name!r}: expected ne {s.ne}, found {info.ne}")
        if s.forced_f32 and info.ggml_type != T.F32:
            raise FormatError(f"tensor {name!r}: expected F32 (the converter always writes it F32), "
                              f"found {info.ggml_type.name}")
    block = mtp_specs(g)
    ignored = [n for n in mtp if n not in block]
    warnings = [f"{len(ignored)} MTP tensor(s) of blocks >= {g.n_layer} are ignored"] if ignored else []
    if block:
        try:
            check_mtp_block(g, lambda n: tensors[n].ne if n in tensors else None)
        except FormatError as exc:
            warnings.append(f"{exc}: draft='mtp' refuses this file's block")
    return warnings


def _layer_of(name: str) -> int | None:
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit():
        return int(parts[1])
    return None
