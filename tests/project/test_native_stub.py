"""src/strata/_native.pyi matches the compiled strata._native: the same public names, the same methods and
properties on each class, and the same parameters (names, kinds, which have defaults) on every function and
method whose signature the extension exposes. The binding's sources mirror the core's headers."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from strata import _native

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "strata"
STUB = PACKAGE / "_native.pyi"
HEADERS = ROOT / "cuda" / "include" / "strata"


def stub_tree() -> ast.Module:
    return ast.parse(STUB.read_text())


def stub_parameters(fn: ast.FunctionDef, method: bool) -> list[tuple[str, str, bool]]:
    """(name, kind, has a default) of each parameter, as inspect.Parameter would say."""
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults = [False] * (len(positional) - len(a.defaults)) + [True] * len(a.defaults)
    params = [(p.arg, "POSITIONAL_OR_KEYWORD", d) for p, d in zip(positional, defaults)]
    params += [(p.arg, "KEYWORD_ONLY", d is not None) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    return params[1:] if method else params


def native_parameters(obj, method: bool) -> list[tuple[str, str, bool]]:
    params = list(inspect.signature(obj).parameters.values())
    params = params[1:] if method else params
    return [(p.name, p.kind.name, p.default is not inspect.Parameter.empty) for p in params]


def public_names() -> set[str]:
    names = set()
    for name in dir(_native):
        obj = getattr(_native, name)
        if name.startswith("_"):
            continue
        if getattr(obj, "__module__", None) == _native.__name__ or isinstance(obj, (int, float, str, tuple)):
            names.add(name)
    return names


def test_the_stub_names_every_public_name_and_no_other():
    tree = stub_tree()
    stubbed = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    stubbed |= {node.target.id for node in tree.body if isinstance(node, ast.AnnAssign)}
    assert stubbed == public_names()


def test_function_signatures_match():
    for node in stub_tree().body:
        if isinstance(node, ast.FunctionDef):
            assert stub_parameters(node, method=False) == native_parameters(getattr(_native, node.name), False), \
                node.name


@pytest.mark.parametrize("cls", [n.name for n in ast.parse(STUB.read_text()).body if isinstance(n, ast.ClassDef)])
def test_class_members_and_method_signatures_match(cls):
    node = next(n for n in stub_tree().body if isinstance(n, ast.ClassDef) and n.name == cls)
    native = getattr(_native, cls)
    members = {item.name for item in node.body if isinstance(item, ast.FunctionDef) and item.name != "__init__"}
    members |= {item.target.id for item in node.body if isinstance(item, ast.AnnAssign)}
    assert members == {name for name in dir(native) if not name.startswith("_")}, cls
    for item in node.body:
        is_property = isinstance(item, ast.FunctionDef) and any(
            isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list)
        if isinstance(item, ast.FunctionDef) and item.name != "__init__" and not is_property:
            got = native_parameters(getattr(native, item.name), method=True)
            assert stub_parameters(item, method=True) == got, f"{cls}.{item.name}"


def test_the_binding_mirrors_the_cores_headers():
    """libstrata/<header>.pxd declares strata/<header>.hpp, binding/<header>.pxi binds a declared header and is
    included by its extension (check/: the test hooks'), and the package's top level keeps only the extensions'
    own files."""
    declared = set()
    for pxd in (PACKAGE / "libstrata").rglob("*.pxd"):
        if pxd.name != "__init__.pxd":
            header = pxd.relative_to(PACKAGE / "libstrata").with_suffix(".hpp").as_posix()
            assert (HEADERS / header).is_file(), pxd
            assert f'cdef extern from "strata/{header}"' in pxd.read_text(), pxd
            declared.add(header)
    for pxi in (PACKAGE / "binding").rglob("*.pxi"):
        relative = pxi.relative_to(PACKAGE / "binding")
        assert relative.with_suffix(".hpp").as_posix() in declared, pxi
        extension = "_native_check.pyx" if relative.parts[0] == "check" else "_native.pyx"
        assert f'include "binding/{relative.as_posix()}"' in (PACKAGE / extension).read_text(), pxi
    top_level = {p.name for p in PACKAGE.iterdir() if p.suffix in (".pyx", ".pxd", ".pxi", ".pyi", ".hpp")}
    assert top_level == {"_native.pyx", "_native.pxd", "_native.pyi", "_native_check.pyx"}


def test_the_limits_python_states_are_the_cores():
    """generation sits below the extension (docs/layout.md), so its logprobs limit is its own statement; the
    server takes generation's, and both must be the session's."""
    from strata import generation
    from strata.models import released
    from strata.runtime.geometry import native_geometry, prompt_prefetch_rows
    from strata.server import requests

    assert generation.MAX_LOGPROBS == requests.MAX_LOGPROBS == _native.MAX_LOGPROBS
    g = released("qwen4exp")
    assert prompt_prefetch_rows(g) == _native.prompt_prefetch_rows(native_geometry(g)) == 2 * g.n_expert
