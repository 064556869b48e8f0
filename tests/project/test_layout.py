"""The package's rooms and who may import whom (docs/layout.md): read from the source, every import counted
(module level, inside functions, under TYPE_CHECKING), so the map and the code cannot drift apart."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "src"
EXTENSIONS = ("_native", "_native_check")  # compiled modules: a room of their own

# Who may import whom, room by room (docs/layout.md). A room may always import itself.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "options": {"errors"},
    "progress": set(),
    "sampling": {"errors"},
    "chat": {"errors"},
    "chat_templates": {"errors", "chat"},
    "devices": {"errors", "native"},
    "models": {"errors"},
    "format": {"errors", "models"},
    "quant": {"errors", "models"},
    "generation": {"errors", "options", "chat", "sampling"},
    "reference": {"errors", "options", "models", "format", "quant", "sampling"},
    "runtime": {"errors", "options", "devices", "progress", "native", "models", "format", "quant", "sampling",
                "generation", "control_vectors"},
    "convert": {"errors", "models", "format", "quant", "progress", "chat_templates"},
    "synth": {"errors", "models", "format", "quant", "progress", "convert"},
    "bench": {"errors", "options", "native", "models", "quant", "sampling", "generation", "runtime", "synth"},
    "cli": {"errors", "options", "devices", "progress", "native", "models", "format", "quant", "sampling",
            "generation", "chat", "chat_templates", "reference", "runtime", "convert", "synth", "api", "server",
            "bench", "control_vectors", "strata"},
    "control_vectors": {"errors", "format"},
    "api": {"errors", "format", "generation", "reference", "runtime", "control_vectors"},
    "server": {"errors", "sampling", "generation", "strata"},
    "strata": {"errors", "options", "devices", "generation", "runtime", "api"},  # src/strata/__init__.py
}


def modules() -> dict[str, Path]:
    out = {}
    for path in (SOURCE / "strata").rglob("*.py"):
        parts = list(path.relative_to(SOURCE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    for name in EXTENSIONS:
        out[f"strata.{name}"] = SOURCE / "strata" / f"{name}.pyx"
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The strata modules `name` imports, resolved to modules (`from strata import models` is strata.models)."""
    if path.suffix != ".py":
        return set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + [base]).strip(".")
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("strata") and target != name:
                found.add(target)
    return found


def room(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "strata"
    return "native" if parts[1] in EXTENSIONS else parts[1]


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_every_room_is_mapped():
    assert {room(m) for m in graph()} - {"native"} == set(ALLOWED)


def test_rooms_import_only_what_the_map_allows():
    wrong = defaultdict(set)
    for module, targets in graph().items():
        for target in targets:
            if room(target) != room(module) and room(target) not in ALLOWED[room(module)]:
                wrong[module].add(target)
    assert not wrong, dict(wrong)


def test_the_runtime_never_imports_the_reference_and_nothing_imports_the_cli():
    for module, targets in graph().items():
        rooms = {room(t) for t in targets}
        assert not (room(module) == "runtime" and "reference" in rooms), module
        assert room(module) == "cli" or "cli" not in rooms, module


def test_no_import_cycles():
    edges = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges.get(module, ())):
            if state.get(target) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(target):] + [target]))
            if target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
