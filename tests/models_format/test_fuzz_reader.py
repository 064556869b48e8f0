"""Bounded fuzzing of inspect(): mutated or truncated valid files either open or raise FormatError.

The tokenizer metadata is fuzzed at the level of its values too (keys retyped, arrays cut short, ids outside
the vocabulary, garbage byte tokens, keys dropped): a file that opens must also build its tokenizer, encode
and decode, or raise FormatError there.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.malformed import Layout, build_tiny, with_kv
from strata.errors import FormatError
from strata.format import inspect
from strata.format.tokenizer_check import BYTE, KEY_TYPES, SPECIAL_ID_KEYS, K, V

FUZZ = settings(max_examples=200, deadline=2000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, int]:
    path = build_tiny(tmp_path_factory.mktemp("fuzz") / "base.gguf", np.random.default_rng(1234))
    blob = path.read_bytes()
    with inspect(path) as mf:
        header_end = mf.data_start       # mutations aim at the structures, not at tensor bytes
    return path.parent, blob, header_end


def _check(directory: Path, blob: bytes) -> None:
    path = directory / "case.gguf"
    path.write_bytes(blob)
    try:
        with inspect(path) as mf:
            for name in list(mf.tensors)[:3]:
                mf.raw(name)
            if K.MODEL in mf.metadata:
                tok = mf.tokenizer()
                tok.decode(tok.encode("hello world<|im_end|>", special=True))
    except FormatError:
        pass


@FUZZ
@given(data=st.data())
def test_mutated_bytes(base: tuple[Path, bytes, int], data: st.DataObject) -> None:
    directory, blob, header_end = base
    mutable = bytearray(blob)
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, header_end - 1))
        mutable[at] = data.draw(st.integers(0, 255))
    _check(directory, bytes(mutable))


@FUZZ
@given(cut=st.integers(0, 1 << 20))
def test_truncated(base: tuple[Path, bytes, int], cut: int) -> None:
    directory, blob, header_end = base
    _check(directory, blob[:cut % (header_end + 64)])


@pytest.fixture(scope="module")
def base_layout(base: tuple[Path, bytes, int]) -> Layout:
    return Layout(base[0] / "base.gguf")


_INTS = {V.UINT8: (0, 2**8 - 1), V.INT8: (-2**7, 2**7 - 1), V.UINT16: (0, 2**16 - 1), V.INT16: (-2**15, 2**15 - 1),
         V.UINT32: (0, 2**32 - 1), V.INT32: (-2**31, 2**31 - 1), V.UINT64: (0, 2**64 - 1), V.INT64: (-2**63, 2**63 - 1)}
_SCALAR_TYPES = [t for t in V if t != V.ARRAY]
TOKENIZER_KEYS = sorted(KEY_TYPES) + [K.CHAT_TEMPLATE + ".tool_use"]


def _values(vtype: V) -> st.SearchStrategy:
    if vtype in _INTS:
        low, high = _INTS[vtype]
        return st.one_of(st.integers(-2, 300), st.integers(low, high)).filter(lambda v: low <= v <= high)
    if vtype == V.BOOL:
        return st.booleans()
    if vtype == V.STRING:
        return st.one_of(st.text(max_size=12), st.sampled_from(["h e", "<0x41>", "<|im_end|>", "gpt2", "qwen2"]))
    return st.floats(width=32 if vtype == V.FLOAT32 else 64, allow_nan=True)


@st.composite
def _retyped(draw: st.DrawFn, layout: Layout) -> dict:
    """A tokenizer key (present or not) set to a value of any type, scalar or array of any length."""
    key, vtype = draw(st.sampled_from(TOKENIZER_KEYS)), draw(st.sampled_from(_SCALAR_TYPES))
    n_tokens = len(layout.values[K.LIST][0])
    if draw(st.booleans()):
        return {key: (draw(_values(vtype)), vtype)}
    length = draw(st.one_of(st.sampled_from([0, 1, n_tokens - 1, n_tokens, n_tokens + 1]), st.integers(0, 300)))
    element = _values(vtype)
    return {key: (draw(st.lists(element, min_size=length, max_size=length)), vtype)}


@st.composite
def _truncated(draw: st.DrawFn, layout: Layout) -> dict:
    """An array of the valid file cut short (its type kept)."""
    key = draw(st.sampled_from([k for k, (v, _) in layout.values.items() if isinstance(v, list)
                                and k.startswith("tokenizer.")]))
    value, vtype = layout.values[key]
    return {key: (value[:draw(st.integers(0, len(value) - 1))], vtype)}


@st.composite
def _id_outside(draw: st.DrawFn, layout: Layout) -> dict:
    """A special-token id (or an EOS list holding one) at or past the vocabulary's end."""
    key = draw(st.sampled_from(sorted(SPECIAL_ID_KEYS.values())))
    bad = draw(st.integers(len(layout.values[K.LIST][0]), 2**32 - 1))
    value = [1, bad] if key == K.EOS_ID and draw(st.booleans()) else bad
    return {key: (value, V.UINT32)}


@st.composite
def _byte_tokens(draw: st.DrawFn, layout: Layout) -> dict:
    """Some tokens typed BYTE, with well-formed or garbage text."""
    tokens, types = list(layout.values[K.LIST][0]), list(layout.values[K.TOKEN_TYPE][0])
    text = st.one_of(st.text(max_size=8), st.integers(0, 255).map(lambda b: f"<0x{b:02X}>"))
    for index in draw(st.lists(st.integers(0, len(tokens) - 1), min_size=1, max_size=5)):
        tokens[index], types[index] = draw(text), int(BYTE)
    return {K.LIST: (tokens, V.STRING), K.TOKEN_TYPE: (types, V.INT32)}


@st.composite
def _dropped(draw: st.DrawFn, layout: Layout) -> dict:
    return {draw(st.sampled_from([k for k in layout.values if k.startswith("tokenizer.")])): None}


@FUZZ
@given(data=st.data())
def test_mutated_tokenizer_metadata(base: tuple[Path, bytes, int], base_layout: Layout, data: st.DataObject) -> None:
    mutation = st.one_of(*(make(base_layout) for make in (_retyped, _truncated, _id_outside, _byte_tokens, _dropped)))
    changes: dict = {}
    for _ in range(data.draw(st.integers(1, 3))):
        changes.update(data.draw(mutation))
    _check(base[0], with_kv(base_layout, changes))
