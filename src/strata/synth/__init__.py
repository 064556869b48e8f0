"""`strata synth`: GGUF models of any supported architecture and geometry with well-formed random weights.

Names, shapes and metadata come from strata.models (the same tables the loader checks); the bytes are
made directly in each type's block layout (see `blocks`), in a thread pool, straight into the file.
The output depends only on the arguments: same seed, same bytes.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gguf
import numpy as np

from strata import models
from strata.convert import tokenizer_meta
from strata.convert.encode import encode
from strata.convert.file_type import file_type_metadata
from strata.convert.gguf_stream import GGUFStream
from strata.errors import InvalidArgument
from strata.quant.forms import fitting_type
from strata.synth import blocks, presets, values
from strata.synth.presets import TypeMix

T = gguf.GGMLQuantizationType
CHUNK_BYTES = 16 << 20
_ENCODABLE = (T.F32, T.F16, T.BF16, T.Q8_0)


def parse_type(name: str) -> T:
    try:
        t = T[name.upper()]
    except KeyError:
        raise InvalidArgument(f"type {name!r} is not a GGML type name") from None
    if not blocks.supported(t):
        raise InvalidArgument(f"type {t.name} cannot be synthesized; supported: "
                              f"{sorted(x.name for x in (*blocks.FLOATS, *blocks.LAYOUTS))}")
    return t


def _mix(types: TypeMix | Mapping[str, str] | str | None, preset: str) -> TypeMix:
    if types is None:
        return presets.default_types(preset)
    if isinstance(types, TypeMix):
        return types
    if isinstance(types, str):
        return TypeMix(*([types] * 5))
    unknown = set(types) - {f.name for f in TypeMix.__dataclass_fields__.values()}
    if unknown:
        raise InvalidArgument(f"types: unknown tensor classes {sorted(unknown)}; expected experts, expert_down, "
                              "dense, embeddings, ple")
    return TypeMix(**types)


def _class_of(name: str) -> str:
    """The TypeMix field (the tensor class) of a tensor."""
    if name.endswith(("ffn_gate_exps.weight", "ffn_up_exps.weight")):
        return "experts"
    if name.endswith("ffn_down_exps.weight"):
        return "expert_down"
    if name in ("token_embd.weight", "output.weight"):
        return "embeddings"
    if name == "per_layer_token_embd.weight":
        return "ple"
    return "dense"


def _class_type(name: str, mix: TypeMix) -> str:
    return getattr(mix, _class_of(name))


def tensor_type(spec: models.TensorSpec, mix: TypeMix) -> T:
    """The type a tensor gets: F32 if forced; a quantized type only where ne0 fills its blocks (else the type
    llama-quantize falls back to, strata.quant.forms.fitting_type, where that fills them, else F16), and never on
    tensors llama-quantize leaves alone."""
    if spec.forced_f32:
        return T.F32
    t = parse_type(_class_type(spec.name, mix))
    if t in blocks.FLOATS:
        return t
    if not spec.quantizable or (values.special(spec.name) and t not in _ENCODABLE):
        return T.F16
    for candidate in (t, fitting_type(t, spec.ne[0])):
        if spec.ne[0] % gguf.GGML_QUANT_SIZES[candidate][0] == 0:
            return candidate
    return T.F16


def fallbacks(specs: list[models.TensorSpec], mix: TypeMix) -> list[str]:
    """A line for each tensor class some of whose tensors cannot take the class's type (rows not whole blocks,
    values it cannot hold) and get another, saying which, as llama-quantize says its fallbacks. Tensors kept in
    float on purpose (forced F32, not quantizable) need no word."""
    counts: dict[tuple[str, str, str, int], int] = {}
    for spec in specs:
        if spec.forced_f32 or not spec.quantizable:
            continue
        wanted, got = parse_type(_class_type(spec.name, mix)), tensor_type(spec, mix)
        if got != wanted:
            key = (_class_of(spec.name).replace("_", "-"), wanted.name, got.name, spec.ne[0])
            counts[key] = counts.get(key, 0) + 1
    return [f"{count} {option} tensor(s) of {cols} columns cannot be {wanted}: written as {got}"
            for (option, wanted, got, cols), count in sorted(counts.items())]


class _Writer:
    """Makes and writes one chunk of one tensor; one reusable buffer per thread."""

    def __init__(self, out: GGUFStream, seed: int):
        self.out, self.seed = out, seed
        self.words = blocks.pool(seed)
        self.local = threading.local()

    def _buffer(self) -> np.ndarray:
        buf = getattr(self.local, "buf", None)
        if buf is None:
            buf = self.local.buf = np.empty(CHUNK_BYTES + 8, np.uint8)
        return buf

    def special(self, index: int, name: str, make: values.Special) -> None:
        t = self.out.tensors[name]
        rng = np.random.Generator(np.random.SFC64(np.random.SeedSequence([self.seed, index])))
        rows = make(rng, tuple(reversed(t.ne))).reshape(-1, t.ne[0])
        self.out.write(name, 0, encode(rows, t.ggml_type))

    def chunk(self, index: int, name: str, chunk: int, start: int, n: int, scale: float) -> None:
        t = self.out.tensors[name]
        data = blocks.random_bytes(self.words, (self.seed, index, chunk), n, self._buffer())
        if t.ggml_type in blocks.FLOATS:
            blocks.fill_float(data, t.ggml_type, scale)
        else:
            blocks.fill_quant(data, t.ggml_type, scale)
        self.out.write(name, start, data)


def synthesize(path: str | Path, arch: str, preset: str = "tiny", n_layer: int | None = None,
               types: TypeMix | Mapping[str, str] | str | None = None, seed: int = 0,
               progress: Callable[[int, int], None] | None = None, threads: int | None = None,
               full_ple: bool = False, overwrite: bool = False, mtp: bool = False,
               notice: Callable[[str], None] | None = None) -> Path:
    """Write a synthetic GGUF of `arch` at `path`; returns the path.

    preset: tiny (seconds, for tests), bench (released width, 16 layers, Q4_K/Q4_0/Q8_0, ~1M-row PLE table)
    or full (the released geometry; its PLE table is ~1M rows unless full_ple). types: a TypeMix, a mapping
    of its field names, or one type name for everything (forced-F32 tensors stay F32). `path` must not exist,
    or be a regular file and `overwrite`; a symbolic link, FIFO or device is refused. With `mtp`, the file
    also holds an MTP block (models.mtp_inventory: qwen4exp, qwen3next, qwen35moe) in llama.cpp's converter
    layout, its tensors after every other, so the main model's bytes equal those of the same seed's file
    without it (its metadata differs: block_count and nextn_predict_layers count the block). `notice` is told, a line
    each, of the tensor classes whose type some tensors could not take and what they got instead (fallbacks).
    """
    g = presets.geometry(arch, preset, n_layer, full_ple)
    mix = _mix(types, preset)
    specs = models.tensor_inventory(g)
    if mtp:
        if arch not in models.MTP_ARCHITECTURES:
            raise InvalidArgument(f"mtp: strata writes no MTP block for {arch} (one of "
                                  f"{', '.join(models.MTP_ARCHITECTURES)})")
        g = dataclasses.replace(g, n_mtp=1)
        specs += models.mtp_inventory(g)
    plan = [(s.name, s.ne, tensor_type(s, mix)) for s in specs]
    for line in fallbacks(specs, mix) if notice is not None else ():
        notice(line)
    eos = g.ple_eos if g.ple_layers else g.n_vocab - 1
    kv = [(gguf.Keys.General.NAME, f"strata-synth-{arch}-{preset}", gguf.GGUFValueType.STRING),
          *models.metadata_for(g), *file_type_metadata((ne, t) for _, ne, t in plan),
          *tokenizer_meta.byte_level(g.n_vocab, eos, chat=True)]
    workers = threads or os.cpu_count() or 1
    with GGUFStream(path, arch, kv, plan, progress, overwrite) as out, ThreadPoolExecutor(workers) as pool:
        try:
            _fill(out, specs, _Writer(out, seed), pool)
        except BaseException:
            pool.shutdown(cancel_futures=True)  # an interrupted write stops now, not after every queued chunk
            raise
    return Path(path)


def _fill(out: GGUFStream, specs: list[models.TensorSpec], writer: _Writer, pool: ThreadPoolExecutor) -> None:
    """Every tensor's data, in chunks spread over `pool`."""
    futures = []
    for index, spec in enumerate(specs):
        t = out.tensors[spec.name]
        make = values.special(spec.name)
        if make is not None:
            futures.append(pool.submit(writer.special, index, spec.name, make))
            continue
        scale = blocks.scale_for(t.ggml_type, values.rms(spec.name, spec.ne))
        unit = gguf.GGML_QUANT_SIZES[t.ggml_type][1] * 8   # whole blocks, and a multiple of 8 bytes
        step = max(unit, CHUNK_BYTES // unit * unit)
        for chunk, start in enumerate(range(0, t.nbytes, step)):
            futures.append(pool.submit(writer.chunk, index, spec.name, chunk, start,
                                       min(step, t.nbytes - start), scale))
    for f in futures:
        f.result()


__all__ = ["TypeMix", "synthesize", "tensor_type"]
