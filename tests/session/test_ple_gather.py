"""The native PLE row gather (strata/ple_gather.hpp, strata._native.PleGather) on the CPU: bit for bit the rows
strata.runtime.ple_rows.PleRows gives (rows and rows_for), for every table type it reads, on random sequences
with EOS cuts and on wrapping uint64 hashes; its state through reset and a snapshot's restore; its refusals. The
hash both run (strata._native.PleNgrams) against the reference's numpy oracle."""

from __future__ import annotations

import dataclasses
import os

import gguf
import numpy as np
import pytest

from support.compare import assert_same_bits
from support.ple_tables import TABLE_OFFSET, ids_with_eos, table_file
from strata import _native
from strata.errors import FormatError, InvalidArgument
from strata.reference.ple import ngram_context, ngram_rows
from strata.runtime.ple_rows import PleRows
from strata.synth import presets

T = gguf.GGMLQuantizationType
NATIVE = [T.F32, T.F16, T.BF16, T.Q8_0]


def tiny(**changes):
    """The tiny qwen4exp geometry with rows of 32 values (whole Q8_0 blocks)."""
    return dataclasses.replace(presets.geometry("qwen4exp", "tiny"), ple_head_dim=32, **changes)


def wrapping(g, rng: np.random.Generator):
    """g with multipliers of 62-64 bits and a vocabulary of 2^31 ids: every product wraps modulo 2^64."""
    multipliers = tuple(int(m) for m in rng.integers(1 << 62, 1 << 64, g.ple_ngram, dtype=np.uint64, endpoint=False))
    return dataclasses.replace(g, ple_multipliers=multipliers, n_vocab=1 << 31)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("ggml_type", NATIVE)
def test_native_rows_are_the_python_rows_bit_for_bit(ggml_type, seed):
    rng = np.random.default_rng(seed)
    g = tiny() if seed != 2 else wrapping(tiny(), rng)
    file, floats = table_file(g, ggml_type, rng, spread=9.0)
    python = PleRows(file, g)
    native = python.native()
    assert isinstance(native, _native.PleGather)
    ids = ids_with_eos(g, rng, 48)
    ids[0] = ids[47] = g.ple_eos  # an EOS first (the context was EOS already) and last
    for t, token in enumerate(ids):
        got, want = native.rows(token), python.rows(token)
        assert not np.isnan(got).any()
        assert_same_bits(got, want, f"{ggml_type.name} token {t} ({token}) of {ids}", infinities=True)
        assert np.array_equal(native.previous, python.previous)
    # rows_for: one call, then two, as a prompt's chunks come; the float table through the reference hash agrees
    ctx = ngram_context(python.previous, np.array(ids), g.ple_eos)
    expected = floats[ngram_rows(ctx, g.ple)]
    assert_same_bits(native.rows_for(ids[:20]), python.rows_for(ids[:20]), "rows_for, one call", infinities=True)
    got = np.concatenate([native.rows_for(ids[20:21]), native.rows_for(np.array(ids[21:]))])
    assert_same_bits(got, python.rows_for(ids[20:]), "rows_for, two calls", infinities=True)
    assert_same_bits(got, expected[20:], "rows_for vs the reference hash", infinities=True)
    assert np.array_equal(native.previous, python.previous)
    assert native.rows_for([]).shape == (0, g.ple.n_heads, g.ple_head_dim)


def test_native_state_resets_and_restores_as_the_python_state(rng):
    g = tiny()
    file, _ = table_file(g, T.Q8_0, rng)
    python = PleRows(file, g)
    ids = ids_with_eos(g, rng, 16)
    python.rows_for(ids[:5])
    native = python.native()  # built mid-sequence: it starts from the Python side's last ids
    assert np.array_equal(native.previous, ids[3:5])
    saved = native.previous
    after = native.rows_for(ids[5:])
    native.previous = saved  # what a snapshot's restore does
    assert_same_bits(native.rows_for(ids[5:]), after, "rows after a restore")
    assert_same_bits(after, python.rows_for(ids[5:]), "rows mid-sequence")
    native.reset()
    assert native.previous.tolist() == [g.ple_eos] * (g.ple_ngram - 1)
    python.reset()
    assert_same_bits(native.rows_for(ids), python.rows_for(ids), "rows after a reset")
    with pytest.raises(InvalidArgument, match="3 previous ids given, the n-gram context keeps 2"):
        native.previous = [1, 2, 3]


@pytest.mark.parametrize("seed", range(4))
def test_the_native_hash_picks_the_reference_rows(seed):
    """strata::PleNgrams (the runtime's one copy of the hash) against strata.reference.ple's numpy oracle, token by
    token and a prompt at once, across EOS cuts, a reset and a restored state; odd seeds wrap every product."""
    rng = np.random.default_rng(seed)
    g = wrapping(tiny(), rng) if seed % 2 else tiny()
    ngrams = _native.PleNgrams(g.ple)
    ids = ids_with_eos(g, rng, 40)
    expected = ngram_rows(ngram_context(ngrams.previous, np.array(ids), g.ple_eos), g.ple)
    assert expected.shape == (40, g.ple.n_heads) and (expected < g.ple_rows).all()
    got = np.stack([ngrams.indices(token) for token in ids[:25]])
    assert got.dtype == np.int64 and np.array_equal(got, expected[:25])
    saved = ngrams.previous
    assert np.array_equal(saved, ids[25 - (g.ple_ngram - 1):25])
    assert np.array_equal(ngrams.indices_for(ids[25:]), expected[25:])
    ngrams.previous = saved  # a snapshot's restore: the same rows again
    assert np.array_equal(ngrams.indices_for(np.array(ids[25:])), expected[25:])
    assert ngrams.indices_for([]).shape == (0, g.ple.n_heads)
    ngrams.reset()
    assert ngrams.previous.tolist() == [g.ple_eos] * (g.ple_ngram - 1)
    assert np.array_equal(ngrams.indices_for(ids), expected)


def test_the_native_hash_refuses_a_shape_it_cannot_run():
    shape = tiny().ple
    with pytest.raises(InvalidArgument, match="layer_multipliers: 2 values for ngram_size 3"):
        _native.PleNgrams(dataclasses.replace(shape, multipliers=shape.multipliers[:2]))
    with pytest.raises(InvalidArgument, match="head_vocab_sizes: head 1 has no rows"):
        _native.PleNgrams(dataclasses.replace(shape, head_sizes=(shape.head_sizes[0], 0) + shape.head_sizes[2:]))
    with pytest.raises(InvalidArgument, match="3 previous ids given, the n-gram context keeps 2"):
        _native.PleNgrams(shape).previous = [1, 2, 3]


@pytest.mark.parametrize("ggml_type", [T.Q4_0, T.Q5_0, T.Q4_1])
def test_other_table_types_stay_on_the_python_path(ggml_type, rng):
    g = tiny()
    file, _ = table_file(g, ggml_type, rng)
    assert PleRows(file, g).native() is None


def test_the_native_gather_refuses_a_table_its_hash_would_read_past(rng):
    g = tiny()
    file, _ = table_file(g, T.F16, rng)
    rows = PleRows(file, g)
    shape = g.ple
    last = shape.n_heads - 1
    short = shape.head_offsets[last] + shape.head_sizes[last] - 1  # the last head's last row missing
    path, offset, _, row_bytes = rows.where

    def first(n: int) -> _native.FileRows:
        return _native.FileRows(path, offset, n, row_bytes)

    with pytest.raises(InvalidArgument, match=rf"head {last} reads rows {shape.head_offsets[last]} \+ "
                                              rf"\[0, {shape.head_sizes[last]}\), past the table's {short} rows"):
        _native.PleGather(first(short), "f16", shape)
    _native.PleGather(first(short + 1), "f16", shape)  # exactly the rows the hash reads
    with pytest.raises(InvalidArgument, match="rows of 64 bytes; 32 values of its type take 128"):
        _native.PleGather(rows.reader(), "f32", shape)
    with pytest.raises(InvalidArgument, match="layer_multipliers: 2 values for ngram_size 3"):
        _native.PleGather(rows.reader(), "f16", dataclasses.replace(shape, multipliers=shape.multipliers[:2]))
    with pytest.raises(InvalidArgument, match="Q8_0 rows of 20 values"):
        _native.PleGather(rows.reader(), "q8_0", dataclasses.replace(shape, head_dim=20))
    with pytest.raises(InvalidArgument, match="PLE row type 'q4_0'"):
        _native.PleGather(rows.reader(), "q4_0", shape)


def test_a_table_truncated_or_rewritten_under_the_gather_is_refused(rng):
    """The rows are read from the file as tokens need them: a file cut short under the reader, or written into,
    raises FormatError naming the file and the table (the row where it ended), and the n-gram state stays that
    of the tokens before; never rows of another file."""
    g = tiny()
    file, _ = table_file(g, T.Q8_0, rng)
    python = PleRows(file, g)
    native = python.native()
    ids = ids_with_eos(g, rng, 16)
    native.rows_for(ids[:4])
    os.truncate(file.path, TABLE_OFFSET + 10 * python.where[3])
    with pytest.raises(FormatError, match=rf"{os.path.basename(file.path)}: .*(row \d+ at bytes .*file ends|changed)"):
        for token in ids[4:]:  # their rows lie past the cut
            before = native.previous
            native.rows(token)
    assert np.array_equal(native.previous, before), "the token whose rows failed joined the n-gram state"
    with pytest.raises(FormatError, match=rf"{os.path.basename(file.path)}: .*changed while it was being read"):
        python.table.gather([0])  # a row the cut kept, in a file that is no longer what was opened


def test_rows_are_read_once_and_kept(rng):
    """A row read once is served from the reader's cache: a token's rows repeated cost no read."""
    g = tiny()
    file, _ = table_file(g, T.F16, rng)
    reader = PleRows(file, g).reader()
    reader.gather([5, 7, 5])
    assert (reader.misses, reader.hits) == (2, 1)
    reader.gather([7, 5])
    assert (reader.misses, reader.hits) == (2, 3)
