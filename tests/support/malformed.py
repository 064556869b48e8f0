"""Builders of small GGUF files for the format tests: a valid tiny qwen4exp file and byte-level corruptions.

`build_tiny` writes a well-formed file with gguf.GGUFWriter (geometry from `tiny_geometry`, keys from
strata.models.metadata_for, tensors from tensor_inventory, random F32 / Q8_0 data, a small byte-level BPE
vocabulary); its keyword arguments make the model-level faults (missing tensors, wrong shapes, bad keys).
`Layout` finds where each structure of a written file lies, so tests can corrupt it byte by byte;
`with_kv` rewrites its metadata (keys replaced with values of any GGUF type, added or dropped) around the
same tensors.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from strata.models import Geometry, metadata_for, tensor_inventory, variant

V = gguf.GGUFValueType
T = gguf.GGMLQuantizationType
ALIGNMENT = 32
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = ("h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d", "Ġ t", "Ġt he")
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def byte_alphabet() -> list[str]:
    """The byte-level BPE alphabet: printable bytes stand for themselves, the others move to U+0100 onwards."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    shifted = iter(range(0x100, 0x200))
    return [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): 256 byte tokens, one token per merge, then the special tokens."""
    tokens = byte_alphabet() + [m.replace(" ", "") for m in MERGES] + list(SPECIALS)
    types = [1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS)
    return tokens, types, list(MERGES)


def tiny_geometry() -> Geometry:
    """4 layers (GDN, GDN+PLE, GDN, QSA attention), n_embd 64, 4 experts: every qwen4exp tensor kind, tiny."""
    recurrent = (True, True, True, False)
    sizes = (37, 41, 43, 47)
    return Geometry(
        arch="qwen4exp", n_layer=4, n_embd=64, n_vocab=len(tiny_vocab()[0]), context_length=4096,
        n_head=4, n_head_kv=2, head_dim=32, rope_dim=16, rope_theta=1e7, rope_sections=(3, 3, 2, 0), rms_eps=1e-6,
        recurrent=recurrent, ssm_n_k_heads=2, ssm_n_v_heads=4, ssm_head_k_dim=16, ssm_head_v_dim=16,
        ssm_conv_kernel=4, n_expert=4, n_expert_used=2, expert_ff=32, shared_ff=32,
        hc_count=4, hc_rank=16, indexer_n_heads=2, indexer_head_dim=32, indexer_top_k=64,
        compress_ratios=(0, 0, 0, 4), ple_layers=(1,), ple_ngram=3, ple_heads_per_ngram=2, ple_conv_kernel=4,
        ple_eos=256 + len(MERGES), ple_head_dim=16, ple_multipliers=(1000003, 2000003, 3000017),
        ple_head_offsets=(0, 37, 78, 121), ple_head_sizes=sizes, ple_rows=256, **variant("qwen4exp"),
    )


def tokenizer_metadata() -> list[tuple[str, Any, V]]:
    tokens, types, merges = tiny_vocab()
    eos = tokens.index("<|endoftext|>")
    return [
        ("tokenizer.ggml.model", "gpt2", V.STRING), ("tokenizer.ggml.pre", "qwen2", V.STRING),
        ("tokenizer.ggml.tokens", tokens, V.STRING), ("tokenizer.ggml.token_type", types, V.INT32),
        ("tokenizer.ggml.merges", merges, V.STRING),
        ("tokenizer.ggml.eos_token_id", eos, V.UINT32), ("tokenizer.ggml.bos_token_id", eos, V.UINT32),
        ("tokenizer.ggml.padding_token_id", eos, V.UINT32), ("tokenizer.ggml.add_bos_token", False, V.BOOL),
        ("tokenizer.chat_template", CHAT_TEMPLATE, V.STRING),
    ]


def _data(rng: np.random.Generator, ne: tuple[int, ...], ggml_type: T) -> np.ndarray:
    values = rng.standard_normal(tuple(reversed(ne))).astype(np.float32)
    if ggml_type == T.F32:
        return values
    if ggml_type == T.F16:
        return values.astype(np.float16)
    return gguf.quants.quantize(values, ggml_type)


def default_type(name: str, ne: tuple[int, ...], forced_f32: bool) -> T:
    """F32 where the converter forces it, Q8_0 for the experts (block 32 fits), F16 elsewhere."""
    if forced_f32:
        return T.F32
    return T.Q8_0 if "_exps" in name and ne[0] % 32 == 0 else T.F16


def build_tiny(path: Path, rng: np.random.Generator, *, geometry: Geometry | None = None,
               drop: tuple[str, ...] = (), extra: Mapping[str, tuple[int, ...]] | None = None,
               shapes: Mapping[str, tuple[int, ...]] | None = None, types: Mapping[str, T] | None = None,
               kv: Mapping[str, tuple[Any, V]] | None = None, kv_drop: tuple[str, ...] = (),
               tokenizer: bool = True) -> Path:
    """Write a tiny qwen4exp GGUF; the keyword arguments inject model-level faults."""
    g = geometry or tiny_geometry()
    writer = gguf.GGUFWriter(path, g.arch)
    writer.add_custom_alignment(ALIGNMENT)
    items = metadata_for(g) + (tokenizer_metadata() if tokenizer else [])
    values = {key: (value, vtype) for key, value, vtype in items if key != "general.architecture"}
    values.update(kv or {})
    for key, (value, vtype) in values.items():
        if key in kv_drop:
            continue
        if isinstance(value, (list, tuple)):
            writer.add_key_value(key, list(value), V.ARRAY, sub_type=vtype)
        else:
            writer.add_key_value(key, value, vtype)
    tensors = [(s.name, s.ne, s.forced_f32) for s in tensor_inventory(g) if s.name not in drop]
    tensors += [(name, ne, False) for name, ne in (extra or {}).items()]
    for name, ne, forced in tensors:
        ne = (shapes or {}).get(name, ne)
        ggml_type = (types or {}).get(name, default_type(name, ne, forced))
        data = _data(rng, ne, ggml_type)
        writer.add_tensor(name, data, raw_dtype=ggml_type if ggml_type not in (T.F32, T.F16) else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


class Layout:
    """Byte positions of the structures of a well-formed GGUF file (found with gguf.GGUFReader)."""

    def __init__(self, path: Path):
        reader = gguf.GGUFReader(path)
        self.kv_start = {name: int(f.offset) for name, f in reader.fields.items() if not name.startswith("GGUF.")}
        self.tensor_start = {t.name: int(t.field.offset) for t in reader.tensors}
        self.data_start = int(min(t.data_offset for t in reader.tensors))
        self.blob = path.read_bytes()
        self.values = {name: (f.contents(), V(f.types[-1])) for name, f in reader.fields.items()
                       if not name.startswith("GGUF.")}

    def kv_type_at(self, key: str) -> int:
        return self.kv_start[key] + 8 + len(key.encode())

    def kv_value_at(self, key: str) -> int:
        return self.kv_type_at(key) + 4

    def tensor_ndims_at(self, name: str) -> int:
        return self.tensor_start[name] + 8 + len(name.encode())

    def tensor_dims_at(self, name: str) -> int:
        return self.tensor_ndims_at(name) + 4

    def tensor_type_at(self, name: str) -> int:
        n_dims = struct.unpack_from("<I", self.blob, self.tensor_ndims_at(name))[0]
        return self.tensor_dims_at(name) + 8 * n_dims

    def tensor_offset_at(self, name: str) -> int:
        return self.tensor_type_at(name) + 4

    def tensor_offset(self, name: str) -> int:
        return struct.unpack_from("<Q", self.blob, self.tensor_offset_at(name))[0]


def patched(blob: bytes, at: int, fmt: str, value: Any) -> bytes:
    """blob with struct `fmt` of `value` written at byte `at`."""
    raw = struct.pack(fmt, value)
    return blob[:at] + raw + blob[at + len(raw):]


_PACK = {V.UINT8: "<B", V.INT8: "<b", V.UINT16: "<H", V.INT16: "<h", V.UINT32: "<I", V.INT32: "<i",
         V.FLOAT32: "<f", V.BOOL: "<?", V.UINT64: "<Q", V.INT64: "<q", V.FLOAT64: "<d"}


def _item(value: Any, vtype: V) -> bytes:
    if vtype == V.STRING:
        raw = value.encode("utf-8")
        return struct.pack("<Q", len(raw)) + raw
    return struct.pack(_PACK[vtype], value)


def encode_kv(key: str, value: Any, vtype: V) -> bytes:
    """One metadata entry; a list is an array whose elements are of vtype (empty arrays too)."""
    if isinstance(value, list):
        items = b"".join(_item(v, vtype) for v in value)
        return _item(key, V.STRING) + struct.pack("<IIQ", V.ARRAY, vtype, len(value)) + items
    return _item(key, V.STRING) + struct.pack("<I", vtype) + _item(value, vtype)


def with_kv(layout: Layout, changes: Mapping[str, tuple[Any, V] | None]) -> bytes:
    """The file with its metadata changed: a key set to (value, type) is replaced or appended, a key set to
    None dropped; the tensor infos and data follow unchanged, the data section re-aligned."""
    keys = list(layout.kv_start)
    infos_start = min(layout.tensor_start.values())
    ends = [*(layout.kv_start[k] for k in keys[1:]), infos_start]
    entries = []
    for key, end in zip(keys, ends):
        if key not in changes:
            entries.append(layout.blob[layout.kv_start[key]:end])
        elif changes[key] is not None:
            entries.append(encode_kv(key, *changes[key]))
    entries += [encode_kv(key, *change) for key, change in changes.items() if key not in keys and change is not None]
    last = max(layout.tensor_start, key=layout.tensor_start.get)
    infos = layout.blob[infos_start:layout.tensor_offset_at(last) + 8]
    head = layout.blob[:16] + struct.pack("<Q", len(entries)) + b"".join(entries) + infos
    return head + bytes(-len(head) % ALIGNMENT) + layout.blob[layout.data_start:]
