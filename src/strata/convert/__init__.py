"""`strata convert`: a transformers checkpoint directory -> a GGUF file in llama.cpp's layout.

Supports qwen4_exp, qwen3_next and qwen3_5_moe checkpoints as `save_pretrained` writes them (config.json
plus *.safetensors, sharded or not). The output is tensor for tensor and key for key what llama.cpp's
convert_hf_to_gguf.py writes (tests/data/llamacpp_*.txt list it; MTP blocks are dropped, as its --no-mtp does,
unless `mtp` keeps the checkpoint's block as block n_layer in llama.cpp's MTP layout: docs/speculative.md).
Tensor names, shapes and metadata keys come from strata.models; the HF -> GGUF transforms are in `tensor_map`.
Tensors stream one piece at a time, so memory stays bounded by the largest single expert / table piece.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from strata import models
from strata.convert import tokenizer_meta
from strata.convert.encode import encode, out_type, tensor_type
from strata.convert.file_type import file_type_metadata
from strata.convert.gguf_stream import GGUFStream
from strata.convert.hf_config import converter_metadata, geometry_fields, load_text_config, mtp_blocks
from strata.convert.naming import general_metadata
from strata.convert.safetensors_reader import Checkpoint
from strata.convert.tensor_map import HFSource, tensor_source
from strata.errors import FormatError


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _check_piece(name: str, piece: np.ndarray, target: tuple[int, ...]) -> None:
    """A piece is the whole tensor, a run of leading-dim rows, or whole trailing sub-tensors (one expert)."""
    p, t = _squeezed(piece.shape), _squeezed(target)
    if p == t[len(t) - len(p):] or (len(p) == len(t) and p[1:] == t[1:]):
        return
    raise FormatError(f"tensor {name!r}: source piece has shape {list(piece.shape)}, "
                      f"which does not fit the GGUF shape {list(target)} (numpy order)")


def _write_tensor(out: GGUFStream, name: str, pieces: Iterator[np.ndarray]) -> None:
    t = out.tensors[name]
    target = tuple(reversed(t.ne))
    at = elements = 0
    for piece in pieces:
        _check_piece(name, piece, target)
        if not np.isfinite(piece).all():
            raise FormatError(f"tensor {name!r}: source holds NaN or infinity")
        data = encode(piece.reshape(-1, t.ne[0]), t.ggml_type)
        out.write(name, at, data)
        at += data.nbytes
        elements += piece.size
    expected = int(np.prod(t.ne, dtype=np.int64))
    if elements != expected:
        raise FormatError(f"tensor {name!r}: source has {elements} elements, GGUF ne {list(t.ne)} needs {expected}")


def convert(hf_dir: str | Path, out_path: str | Path, outtype: str = "f32",
            progress: Callable[[int, int], None] | None = None, overwrite: bool = False, mtp: bool = False) -> Path:
    """Convert a transformers checkpoint directory to a GGUF at `out_path`; returns the path.

    outtype is one of f32, f16, bf16, q8_0 (norms, router and conv weights stay F32, as llama.cpp does).
    `out_path` must not exist, or be a regular file and `overwrite`; a symbolic link, FIFO or device is refused.
    With `mtp`, the checkpoint's MTP block (`mtp.*`) is written too, after every other tensor (FormatError where
    it has none).
    """
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    otype = out_type(outtype)
    arch, cfg = load_text_config(hf_dir)
    ckpt = Checkpoint(hf_dir)
    try:
        g = models.Geometry(**geometry_fields(arch, cfg, ckpt))
        if mtp:
            g = dataclasses.replace(g, n_mtp=mtp_blocks(cfg, ckpt))
        specs = models.tensor_inventory(g) + (models.mtp_inventory(g) if mtp else [])
        plan = [(s.name, s.ne, tensor_type(s.ne, s.forced_f32, otype)) for s in specs]
        eos = cfg.get("eos_token_id")
        vocab = tokenizer_meta.from_hf_dir(arch, hf_dir, g.n_vocab, cfg) or tokenizer_meta.byte_level(
            g.n_vocab, eos[-1] if isinstance(eos, list) else eos)
        # the keys of llama.cpp's converter, in its order: general, architecture, encoding, tokenizer
        kv = [*general_metadata(hf_dir, arch, plan), *models.metadata_for(g), *converter_metadata(arch, cfg, g),
              *file_type_metadata((ne, t) for _, ne, t in plan), *vocab]
        src = HFSource(ckpt, g)
        with GGUFStream(out_path, arch, kv, plan, progress, overwrite) as out:
            for s in specs:
                _write_tensor(out, s.name, tensor_source(src, s.name))
    finally:
        ckpt.close()
    return out_path


__all__ = ["convert"]
