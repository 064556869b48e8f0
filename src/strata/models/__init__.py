"""The architectures strata runs: geometry from GGUF metadata, the metadata writers need, tensor inventories
and each tensor's role. Every architecture fact lives in this package; the engines read the flags it sets."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import gguf

from strata.errors import FormatError
from strata.models import common, qwen3next, qwen4exp
from strata.models.geometry import ARCHITECTURES, Alternative, Geometry, PleShape, Role, TensorSpec
from strata.models.keys import MetadataReader, check


def _arch_of(kv: Mapping[str, Any]) -> str:
    arch = kv.get("general.architecture")
    if arch is None:
        raise FormatError("metadata key 'general.architecture' is missing")
    check(arch in ARCHITECTURES, "general.architecture", f"one of {list(ARCHITECTURES)}", arch)
    return arch


def _n_vocab(kv: Mapping[str, Any], arch: str) -> int:
    # llama.cpp takes the vocabulary size from {arch}.vocab_size when present, else from the token list.
    if f"{arch}.vocab_size" in kv:
        return MetadataReader(kv, arch).int("vocab_size")
    tokens = kv.get("tokenizer.ggml.tokens")
    if isinstance(tokens, (list, tuple)) and tokens:
        return len(tokens)
    raise FormatError(f"metadata: the vocabulary size is unknown: neither {arch}.vocab_size "
                      "nor a non-empty tokenizer.ggml.tokens is present")


def geometry_from_metadata(kv: Mapping[str, Any]) -> Geometry:
    """Geometry of a file from its metadata (GGUF key -> plain value); FormatError names a bad key."""
    arch = _arch_of(kv)
    n_vocab = _n_vocab(kv, arch)
    if arch == qwen4exp.ARCH:
        return qwen4exp.geometry(kv, n_vocab)
    return qwen3next.geometry(kv, arch, n_vocab)


def validate(g: Geometry) -> None:
    """The checks geometry_from_metadata applies, for a Geometry built some other way."""
    check(g.arch in ARCHITECTURES, "general.architecture", f"one of {list(ARCHITECTURES)}", g.arch)
    (qwen4exp.validate if g.arch == qwen4exp.ARCH else qwen3next.validate)(g)


def metadata_for(g: Geometry) -> list[tuple[str, Any, gguf.GGUFValueType]]:
    """The architecture keys llama.cpp's converter writes for g; an array's type is its element type."""
    validate(g)
    return qwen4exp.metadata(g) if g.arch == qwen4exp.ARCH else qwen3next.metadata(g)


def tensor_inventory(g: Geometry) -> list[TensorSpec]:
    """Every tensor the architecture requires, in file order."""
    return qwen4exp.inventory(g) if g.arch == qwen4exp.ARCH else qwen3next.inventory(g)


def tensor_alternatives(g: Geometry) -> list[Alternative]:
    """Tensors a file may hold instead of some inventory tensors (merged expert gate+up, legacy ssm_in)."""
    return qwen4exp.alternatives(g) if g.arch == qwen4exp.ARCH else qwen3next.alternatives(g)


# The architectures whose MTP block strata writes and runs (docs/speculative.md, "MTP drafts").
MTP_ARCHITECTURES: tuple[str, ...] = (qwen4exp.ARCH, *qwen3next.ARCHS)


def _mtp_arch(g: Geometry) -> None:
    if not g.n_mtp:
        raise FormatError(f"{g.arch}: the file has no MTP block ({g.arch}.nextn_predict_layers is absent or 0)")
    if g.arch not in MTP_ARCHITECTURES:
        raise FormatError(f"{g.arch}: its MTP block is not supported (one of {', '.join(MTP_ARCHITECTURES)})")


def mtp_inventory(g: Geometry) -> list[TensorSpec]:
    """The required tensors of the MTP block (block n_layer; strata runs the first of g.n_mtp blocks);
    FormatError where `g` has none or its architecture's block is not supported."""
    _mtp_arch(g)
    return qwen4exp.mtp_inventory(g) if g.arch == qwen4exp.ARCH else qwen3next.mtp_inventory(g)


def mtp_optional(g: Geometry) -> list[TensorSpec]:
    """Tensors the MTP block may hold: its own embedding and LM head."""
    _mtp_arch(g)
    return qwen4exp.mtp_optional(g) if g.arch == qwen4exp.ARCH else qwen3next.mtp_optional(g)


def mtp_alternatives(g: Geometry) -> list[Alternative]:
    """Tensors the MTP block may hold instead of some of its inventory's (merged expert gate+up)."""
    _mtp_arch(g)
    return [common.merged_experts(g, g.n_layer)]


@functools.lru_cache(maxsize=16)
def mtp_specs(g: Geometry) -> Mapping[str, TensorSpec]:
    """The spec of every tensor the MTP block strata runs may hold (its inventory, optional tensors and accepted
    alternatives), by name; empty where `g` has no block or its architecture's is not supported. The GPU engine
    loads none of them (tensor_specs); the reference's MTP drafts read them."""
    if not g.n_mtp or g.arch not in MTP_ARCHITECTURES:
        return MappingProxyType({})
    specs = {s.name: s for s in (*mtp_inventory(g), *mtp_optional(g))}
    specs.update((alt.spec.name, alt.spec) for alt in mtp_alternatives(g))
    return MappingProxyType(specs)


@functools.lru_cache(maxsize=16)
def tensor_specs(g: Geometry) -> Mapping[str, TensorSpec]:
    """The spec (layer, role, ...) of every tensor a file of `g` may hold: its inventory and every accepted
    alternative. Names not in it (the tensors of MTP blocks: mtp_specs, read by the reference's MTP drafts
    only) are not loaded."""
    specs = {s.name: s for s in tensor_inventory(g)}
    specs.update((alt.spec.name, alt.spec) for alt in tensor_alternatives(g))
    return MappingProxyType(specs)


def variant(arch: str) -> dict[str, Any]:
    """The Geometry flags of `arch`'s variant (GDN head mapping, b/a layout and output gate; QSA block)."""
    if arch == qwen4exp.ARCH:
        return dict(qwen4exp.VARIANT)
    if arch in qwen3next.ARCHS:
        return dict(qwen3next.VARIANTS[arch])
    raise FormatError(f"architecture {arch!r} is not one of {list(ARCHITECTURES)}")


def released(arch: str) -> Geometry:
    """qwen4exp: Qwen3.8-Flash-Next; qwen3next: Qwen3-Next-80B-A3B; qwen35moe: Qwen3.5-35B-A3B."""
    if arch == qwen4exp.ARCH:
        return qwen4exp.released()
    if arch in qwen3next.ARCHS:
        return qwen3next.released(arch)
    raise FormatError(f"architecture {arch!r} is not one of {list(ARCHITECTURES)}")


__all__ = ["ARCHITECTURES", "MTP_ARCHITECTURES", "Alternative", "Geometry", "PleShape", "Role", "TensorSpec",
           "geometry_from_metadata", "metadata_for", "mtp_alternatives", "mtp_inventory", "mtp_optional", "mtp_specs",
           "released", "tensor_alternatives", "tensor_inventory", "tensor_specs", "validate", "variant"]
