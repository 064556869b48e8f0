"""Loading a model: every tensor repacked into its canonical form and put where it lives at run time
(architecture.md, 'What lives where'): dense weights to one VRAM arena, routed experts to host memory for
the CPU pool, the n-gram table left memory-mapped."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import numpy as np

from strata.format import ModelFile
from strata.plan import is_ngram_table, is_routed_expert
from strata.quant import QuantTensor, cache, dequantize, repack

Held = QuantTensor | np.ndarray

# Tensors the decode program reads elementwise (norm gammas, conv kernels, GDN constants, the shared expert's
# gate vector), not through a GEMV: they must reach VRAM as float32 whatever the file stores (a PLE conv
# kernel may be F16, a community file may quantize anything 2-D).
ELEMENTWISE_SUFFIXES = ("norm.weight", "_norm_key.weight", "_norm_query.weight", "_norm_conv.weight", "ssm_a",
                        "ssm_dt.bias", "conv1d.weight", "ffn_gate_inp_shexp.weight")


def is_elementwise(name: str) -> bool:
    return name.endswith(ELEMENTWISE_SUFFIXES)


def dense_names(model: ModelFile) -> list[str]:
    """The tensors that go to VRAM, in file order."""
    return [name for name in model.tensors if not is_routed_expert(name) and not is_ngram_table(name)]


def repacked(model: ModelFile, names: list[str], progress: Callable[[int, int], None] | None = None
             ) -> Iterator[tuple[str, Held]]:
    """(name, canonical form) for each of `names`, reporting GGUF bytes done out of the total."""
    total = sum(model.tensors[name].nbytes for name in names)
    done = 0
    for name in names:
        info = model.tensors[name]
        held = repack(model.raw(name), info.ggml_type, info.ne, name=name)
        if is_elementwise(name) and not (isinstance(held, np.ndarray) and held.dtype == np.float32):
            held = dequantize(held)
        yield name, held
        done += info.nbytes
        if progress:
            progress(done, total)


def dense_weights(model: ModelFile, cache_path: str | os.PathLike[str] | None = None,
                  progress: Callable[[int, int], None] | None = None) -> dict[str, Held]:
    """The dense tensors in canonical form. With `cache_path`, a valid cache of this file is memory-mapped
    instead (the second load costs a read, not a repack); a missing or stale one is rebuilt there."""
    def build() -> dict[str, Held]:
        return dict(repacked(model, dense_names(model), progress))

    return build() if cache_path is None else cache.load_or_build(cache_path, model.path, build)


def upload_dense(model: ModelFile, device: int = 0, cache_path: str | os.PathLike[str] | None = None,
                 progress: Callable[[int, int], None] | None = None):
    """The model's dense weights in VRAM (strata._native.DeviceWeights)."""
    from strata import _native

    return _native.DeviceWeights(dense_weights(model, cache_path, progress), device)
