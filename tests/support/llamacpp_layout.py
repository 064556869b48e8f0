"""The listings of llama.cpp-converted files in tests/data (llamacpp_<arch>.txt): parsed, and expanded for one
checkpoint into the exact tensors (name -> ne, type class) and metadata keys (key -> value type, required) that
llama.cpp's converter would write for it. The file format is described in each listing's header."""

from __future__ import annotations

import ast
import fnmatch
import json
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

DATA = Path(__file__).resolve().parents[1] / "data"
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


@dataclass(frozen=True)
class Key:
    pattern: str          # the key, or a glob (general.*)
    value_type: str       # "uint32", "array[int32]", ... or "*"
    required: bool


@dataclass(frozen=True)
class Layout:
    tensors: dict[str, tuple[tuple[int, ...], str]]   # name -> (ne, "f32" | "out")
    keys: list[Key]

    def key_for(self, key: str) -> Key | None:
        """The listing's entry for a key the file holds: its exact line, else the first glob that matches."""
        exact = [k for k in self.keys if k.pattern == key]
        return exact[0] if exact else next((k for k in self.keys if fnmatch.fnmatchcase(key, k.pattern)), None)


def _evaluate(expression: str, names: dict[str, int]) -> int:
    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return int(names[node.id])
        raise ValueError(f"listing expression {expression!r}: {ast.dump(node)} is not + - * // of names and ints")
    return walk(ast.parse(expression.strip(), mode="eval").body)


def _sections(text: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    lines: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            lines = sections.setdefault(line[1:-1], [])
        else:
            lines.append(line)
    return sections


def _layer_sets(cfg: dict[str, Any]) -> dict[str, list[int]]:
    types = cfg["layer_types"]
    return {"all": list(range(cfg["num_hidden_layers"])),
            "recurrent": [i for i, t in enumerate(types) if t == "linear_attention"],
            "attention": [i for i, t in enumerate(types) if t != "linear_attention"],
            "ple": [i - 1 for i in cfg.get("ple_layer_ids") or []]}


def expected_layout(arch: str, hf_dir: Path, checkpoint_sizes: dict[str, int]) -> Layout:
    """The listing of `arch` for the checkpoint in hf_dir (config.json; sizes only the checkpoint knows given)."""
    top = json.loads((hf_dir / "config.json").read_text())
    cfg = {**top, **(top.get("text_config") or {})}
    sections = _sections((DATA / f"llamacpp_{arch}.txt").read_text())
    names = {k: v for k, v in cfg.items() if isinstance(v, int) and not isinstance(v, bool)}
    names.update(checkpoint_sizes)
    for line in sections["sizes"]:
        name, expression = (part.strip() for part in line.split("=", 1))
        names[name] = _evaluate(expression, names)
    layers = _layer_sets(cfg)
    tensors: dict[str, tuple[tuple[int, ...], str]] = {}
    for line in sections["tensors"]:
        pattern, ne, type_class = (part.strip() for part in line.split("|"))
        shape = tuple(_evaluate(d, names) for d in ne.split(","))
        if pattern.startswith("blk.{"):
            which, rest = pattern[len("blk.{"):].split("}", 1)
            tensors.update((f"blk.{i}{rest}", (shape, type_class)) for i in layers[which])
        else:
            tensors[pattern] = (shape, type_class)
    keys = []
    for line in sections["metadata"]:
        parts = [part.strip() for part in line.split("|")]
        keys.append(Key(parts[0].replace("{arch}", arch), parts[1], len(parts) < 3 or parts[2] != "?"))
    return Layout(tensors, keys)


def value_type(field: gguf.ReaderField) -> str:
    """A GGUF field's type as the listings write it: uint32, string, array[int32], ..."""
    names = [gguf.GGUFValueType(t).name.lower() for t in field.types]
    return f"array[{names[1]}]" if names[0] == "array" else names[0]


def type_of_class(type_class: str, ne: tuple[int, ...], outtype: gguf.GGMLQuantizationType):
    """The ggml type llama.cpp's converter gives a tensor of this class and shape at this --outtype."""
    if type_class == "f32":
        return gguf.GGMLQuantizationType.F32
    if outtype == gguf.GGMLQuantizationType.Q8_0 and ne[0] % 32:
        return gguf.GGMLQuantizationType.F16
    return outtype
