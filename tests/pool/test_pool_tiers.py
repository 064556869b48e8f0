"""The CPU pool's disk tier (docs/tiers.md) against the same experts all in RAM, bit for bit.

A layer's experts are written to a file as GGUF blocks (random, at unaligned offsets). One pool registers them
as strata.quant.repack makes them, all in RAM; the other reads them from the file with a share in its arena
(0 %, 30 %, 100 %). Every call of the second must give the first's bits: decode-like calls (run_layer,
run_layer_sum, with skipped slots, repeated ids and the arena moving) and grouped ones (run_groups, in waves of
the staging's size). The native repack of each block type is held to strata.quant.repack through read_expert, and
a file truncated or changed under the reader must raise, never answer. Outputs are poisoned (NaN) before every call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from strata.errors import FormatError, InvalidArgument
from strata.quant import repack
from strata.quant.forms import fitting_type, form_for
from strata.quant.synthetic import random_blocks
from strata.runtime.pool import ExpertPool, FileMatrix, tier_sizes, tier_types

_native = pytest.importorskip("strata._native")

N_EMBD, FF, N_EXPERT, K = 512, 256, 16, 4
MAX_ROWS = 96
SHARES = (0.0, 0.3, 1.0)
# Every type the tier repacks; the lattice i-quants are not yet among them.
TIER_TYPES = (T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
              T.IQ4_NL, T.IQ4_XS, T.MXFP4, T.TQ1_0, T.TQ2_0)
# Layers of the sweeps: a K-quant mix as llama-quantize writes it, a float layer, and float beside quantized.
LAYERS = {"Q4_K|Q4_K|Q6_K": (T.Q4_K, T.Q4_K, T.Q6_K), "BF16": (T.BF16,) * 3, "Q8_0|F16|Q4_0": (T.Q8_0, T.F16, T.Q4_0)}


@dataclass
class LayerFile:
    path: Path
    matrices: tuple[FileMatrix, FileMatrix, FileMatrix]
    weights: tuple  # gate, up, down as repack makes them: what the all-in-RAM pool holds


def write_layer(path: Path, types: tuple[T, T, T], rng: np.random.Generator, merged: bool = False, *,
                n_embd: int = N_EMBD, ff: int = FF, repacked: bool = True) -> LayerFile:
    """One layer's experts as GGUF blocks in `path` behind odd-sized junk, gate and up as separate tensors or as one
    merged gate_up tensor (each expert's gate rows, then its up rows, as ffn_gate_up_exps holds them); with
    `repacked`, also as strata.quant.repack makes them."""
    shapes = ((n_embd, ff), (n_embd, ff), (ff, n_embd))  # (cols, rows) per expert
    fitted = [fitting_type(t, cols) for t, (cols, _) in zip(types, shapes)]
    raw = [random_blocks(t, cols * rows * N_EXPERT, rng) for t, (cols, rows) in zip(fitted, shapes)]
    weights = tuple(repack(r, t, (cols, rows, N_EXPERT)) for r, t, (cols, rows) in zip(raw, fitted, shapes)
                    if repacked)
    per_expert = [r.size // N_EXPERT for r in raw]
    chunks, places = [rng.bytes(37)], []
    at = 37
    if merged:
        assert fitted[0] == fitted[1]
        pairs = np.concatenate([raw[0].reshape(N_EXPERT, -1), raw[1].reshape(N_EXPERT, -1)], axis=1)
        places += [(at, 2 * per_expert[0]), (at + per_expert[0], 2 * per_expert[0])]
        chunks.append(pairs.tobytes())
        at += pairs.size
    else:
        for m in (0, 1):
            places.append((at, per_expert[m]))
            chunks += [raw[m].tobytes(), rng.bytes(13)]
            at += raw[m].size + 13
    places.append((at, per_expert[2]))
    chunks += [raw[2].tobytes(), rng.bytes(5000)]
    path.write_bytes(b"".join(chunks))
    matrices = tuple(FileMatrix(form_for(t), rows, cols, int(t), offset, stride)
                     for t, (cols, rows), (offset, stride) in zip(fitted, shapes, places))
    return LayerFile(path, matrices, weights)


def whole_pool(layer: LayerFile, isa: str | None = None) -> ExpertPool:
    pool = ExpertPool(N_EMBD, FF, K, isa=isa, max_rows=MAX_ROWS)
    pool.set_layer(0, *layer.weights, n_expert=N_EXPERT)
    return pool


def tiered_pool(layer: LayerFile, share: float, *, direct: bool = True, policy: dict | None = None,
                isa: str | None = None, staging_slots: int = 0) -> ExpertPool:
    slots = round(share * N_EXPERT)
    pool = ExpertPool(N_EMBD, FF, K, isa=isa, max_rows=MAX_ROWS)
    pool.open_file(str(layer.path), direct=direct, io_threads=3, staging_slots=staging_slots)
    pool.set_tiered_layer(0, layer.matrices, N_EXPERT, slots, list(range(slots)), policy)
    return pool


def decode_call(rng: np.random.Generator, hot: np.ndarray | None = None):
    """x, ids, weights and skip of one token: top-K ids (from `hot` half the time), a slot in the VRAM cache now
    and then, an id given twice once in a while."""
    x = rng.standard_normal(N_EMBD, dtype=np.float32) * np.float32(rng.uniform(0.1, 10))
    pick = hot if hot is not None and rng.random() < 0.5 else np.arange(N_EXPERT)
    ids = rng.choice(pick, K, replace=False).astype(np.int32)
    if rng.random() < 0.1:
        ids[-1] = ids[0]
    weights = rng.uniform(0.05, 1.0, K).astype(np.float32)
    skip = (rng.random(K) < 0.2).astype(np.uint8)
    return x, ids, weights, skip


def same_bits(got: np.ndarray, want: np.ndarray, note: str) -> None:
    assert np.all(np.isfinite(want)), note
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), note)


def check_decode_calls(whole: ExpertPool, tiered: ExpertPool, rng: np.random.Generator, calls: int, note: str,
                       hot: np.ndarray | None = None) -> None:
    for call in range(calls):
        x, ids, weights, skip = decode_call(rng, hot)
        where = f"{note}, call {call}, ids {ids}, skip {skip}"
        if call % 2:
            want = whole.run_layer_sum(0, x, ids, weights, skip)
            got = tiered.run_layer_sum(0, x, ids, weights, skip, np.full(N_EMBD, np.nan, np.float32))
            same_bits(got, want, where)
        else:
            want = whole.run_layer(0, x, ids, weights, skip, np.full((K, N_EMBD), np.nan, np.float32))
            got = tiered.run_layer(0, x, ids, weights, skip, np.full((K, N_EMBD), np.nan, np.float32))
            kept = skip == 0
            same_bits(got[kept], want[kept], where)
            assert np.all(np.isnan(got[~kept])), f"a skipped row was written ({where})"


def grouped_call(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A prompt chunk's rows grouped by expert: most experts, some groups empty, rows of very different scales."""
    experts = np.sort(rng.choice(N_EXPERT, rng.integers(1, N_EXPERT + 1), replace=False)).astype(np.int32)
    sizes = rng.integers(0, 9, experts.size)
    sizes[rng.integers(experts.size)] += 1
    begin = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    x = rng.standard_normal((int(begin[-1]), N_EMBD), dtype=np.float32) * rng.uniform(0.1, 10, (int(begin[-1]), 1))
    return x.astype(np.float32), experts, begin


def check_grouped_calls(whole: ExpertPool, tiered: ExpertPool, rng: np.random.Generator, calls: int,
                        note: str) -> None:
    for call in range(calls):
        x, experts, begin = grouped_call(rng)
        want = whole.run_groups(0, x, experts, begin, np.full((x.shape[0], N_EMBD), np.nan, np.float32))
        got = tiered.run_groups(0, x, experts, begin, np.full((x.shape[0], N_EMBD), np.nan, np.float32))
        same_bits(got, want, f"{note}, grouped call {call}, experts {experts}, begin {begin}")


def check_rows_calls(whole: ExpertPool, tiered: ExpertPool, rng: np.random.Generator, calls: int, note: str) -> None:
    """Several decode rows at once (run_rows_sum: a batch's or a verification's), against each row's decode answer
    from all in RAM."""
    for call in range(calls):
        rows = [decode_call(rng) for _ in range(int(rng.integers(1, 9)))]
        x, ids, weights, skip = (np.stack(parts) for parts in zip(*rows))
        want = np.stack([whole.run_layer_sum(0, *row) for row in rows])
        got = tiered.run_rows_sum(0, x, ids, weights, skip, np.full(x.shape, np.nan, np.float32))
        same_bits(got, want, f"{note}, rows call {call}, ids {ids.tolist()}")


@pytest.mark.parametrize("merged", [False, True], ids=["gate+up", "gate_up"])
@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("layer", list(LAYERS))
def test_tiered_calls_match_all_in_ram(tmp_path, rng, layer, share, merged):
    if merged and LAYERS[layer][0] != LAYERS[layer][1]:
        pytest.skip("a merged gate_up tensor has one type")
    f = write_layer(tmp_path / "experts.bin", LAYERS[layer], rng, merged)
    note = f"{layer}, {share:.0%} in RAM, {'merged' if merged else 'separate'} gate/up"
    with whole_pool(f) as whole, tiered_pool(f, share, policy={"admit_after": 2, "window": 8}) as tiered:
        hot = rng.choice(N_EXPERT, 6, replace=False)
        check_decode_calls(whole, tiered, rng, 24, note, hot)
        check_grouped_calls(whole, tiered, rng, 4, note)
        check_rows_calls(whole, tiered, rng, 3, note)
        (stats,) = tiered.tier_stats()
        assert stats["slots"] == round(share * N_EXPERT)
        assert stats["misses"] > 0 if share < 1 else stats["misses"] == 0
        assert stats["hits"] > 0 if share > 0 else stats["hits"] == 0
        assert sorted(e for e in stats["experts"] if e >= 0) == sorted(set(stats["experts"]) - {-1})


def test_an_expert_in_several_groups(tmp_path, rng):
    """Groups need not be one per expert (a batch's rows, a caller's choice): an expert in two groups, one of them
    empty now and not in the call before, is read once per wave and computed for both."""
    f = write_layer(tmp_path / "experts.bin", LAYERS["Q8_0|F16|Q4_0"], rng)
    with whole_pool(f) as whole, tiered_pool(f, 0.25, staging_slots=K) as tiered:
        for call in range(12):
            experts = rng.integers(0, N_EXPERT, rng.integers(1, 12)).astype(np.int32)
            sizes = rng.integers(0, 4, experts.size)
            begin = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
            if begin[-1] == 0:
                continue
            x = rng.standard_normal((int(begin[-1]), N_EMBD), dtype=np.float32)
            want = whole.run_groups(0, x, experts, begin, np.full(x.shape, np.nan, np.float32))
            got = tiered.run_groups(0, x, experts, begin, np.full(x.shape, np.nan, np.float32))
            same_bits(got, want, f"call {call}, experts {experts}, begin {begin}")


def test_matrices_read_in_pieces(tmp_path, rng):
    """A matrix larger than an I/O piece (256 KiB: F32 gate, up and down of 512 KiB at unaligned offsets, three
    pieces each) is read by several I/O threads side by side into one bounce: the answers stay the all-in-RAM
    ones, and a file cut inside a matrix's last piece still raises, naming the file."""
    f = write_layer(tmp_path / "experts.bin", (T.F32,) * 3, rng)
    assert all(m.stride == 2 * 256 * 1024 and m.offset % 4096 for m in f.matrices)
    with whole_pool(f) as whole, tiered_pool(f, 0.25) as tiered:
        check_decode_calls(whole, tiered, rng, 8, "F32 in pieces")
        check_grouped_calls(whole, tiered, rng, 2, "F32 in pieces")
    with tiered_pool(f, 0.25, policy={"replace": False}) as tiered:
        os.truncate(f.path, f.matrices[2].offset + 15 * f.matrices[2].stride - 10)  # in the last piece of 14's down
        with pytest.raises(FormatError, match=f"{f.path.name}.*(file ends|changed)"):
            poisoned_call(tiered, rng, [0, 14])


def test_misses_are_read_once_per_call(tmp_path, rng):
    """A decode call reads each missed expert once, an id given twice included; a grouped call reads each of
    its experts once; nothing is read for a hit or for a skipped slot. The arena's fill is read once too."""
    f = write_layer(tmp_path / "experts.bin", LAYERS["Q4_K|Q4_K|Q6_K"], rng)
    expert_file_bytes = sum(GGML_QUANT_SIZES[T(m.ggml_type)][1] * m.rows * m.cols
                            // GGML_QUANT_SIZES[T(m.ggml_type)][0] for m in f.matrices)
    with tiered_pool(f, 0.25, policy={"replace": False}) as tiered:  # experts 0..3 in the arena
        x = rng.standard_normal(N_EMBD, dtype=np.float32)
        ids = np.array([9, 9, 2, 12], np.int32)
        tiered.run_layer_sum(0, x, ids, np.ones(K, np.float32), np.array([0, 0, 0, 1], np.uint8))
        (stats,) = tiered.tier_stats()
        assert (stats["hits"], stats["misses"], stats["bytes_read"]) == (1, 1, 5 * expert_file_bytes)
        x, experts, begin = grouped_call(rng)
        tiered.run_groups(0, x, experts, begin)
        (after,) = tiered.tier_stats()
        touched = experts[np.diff(begin) > 0]
        assert after["misses"] - stats["misses"] == np.count_nonzero(touched >= 4)
        assert after["hits"] - stats["hits"] == np.count_nonzero(touched < 4)


def test_arena_follows_the_routing(tmp_path, rng):
    """Experts routed again and again while missing move into the arena (lfru, one tier down); the ones that are
    no longer routed leave; the output stays the all-in-RAM output throughout."""
    f = write_layer(tmp_path / "experts.bin", LAYERS["Q8_0|F16|Q4_0"], rng)
    hot = np.array([10, 11, 12, 13], np.int32)
    with whole_pool(f) as whole, tiered_pool(f, 0.25, policy={"admit_after": 2, "window": 4, "max_moves": 2}) as t:
        for call in range(8):
            x = rng.standard_normal(N_EMBD, dtype=np.float32)
            weights = rng.uniform(0.1, 1, K).astype(np.float32)
            want = whole.run_layer_sum(0, x, hot, weights)
            same_bits(t.run_layer_sum(0, x, hot, weights), want, f"call {call}")
        (stats,) = t.tier_stats()
        assert sorted(stats["experts"]) == hot.tolist()
        assert stats["moves"] == 4 and stats["hits"] > 0
        check_decode_calls(whole, t, rng, 6, "after the moves")


@pytest.mark.parametrize("ggml_type", TIER_TYPES, ids=lambda t: t.name)
def test_native_repack_is_repack(tmp_path, rng, ggml_type):
    """What the pool repacks from the file is what strata.quant.repack makes of the same blocks, bit for bit, for
    every expert (read through the arena and through the staging) and every type the tier reads."""
    f = write_layer(tmp_path / "experts.bin", (ggml_type,) * 3, rng)
    with whole_pool(f) as whole, tiered_pool(f, 0.5) as tiered:
        for e in range(N_EXPERT):
            want = whole.read_expert(0, e)
            assert want.nbytes == whole.layer_bytes(0) == tiered.layer_bytes(0)
            np.testing.assert_array_equal(tiered.read_expert(0, e), want, f"{ggml_type.name} expert {e}")
        x, ids, weights, _ = decode_call(rng)
        same_bits(tiered.run_layer_sum(0, x, ids, weights), whole.run_layer_sum(0, x, ids, weights), ggml_type.name)


def test_read_expert_is_the_repacked_planes(tmp_path, rng):
    """read_expert of an all-in-RAM layer is the repacked planes of that expert, in their order: the reference the
    tier's test above stands on."""
    f = write_layer(tmp_path / "experts.bin", LAYERS["Q4_K|Q4_K|Q6_K"], rng)
    with whole_pool(f) as whole:
        for e in (0, 7, N_EXPERT - 1):
            parts = []
            for w in f.weights:
                rows = w.rows // N_EXPERT
                parts += [p[e * rows:(e + 1) * rows].reshape(-1).view(np.uint8) for p in w.planes().values()]
            np.testing.assert_array_equal(whole.read_expert(0, e), np.concatenate(parts))


def test_waves_of_a_small_staging(tmp_path, rng):
    """Grouped calls with more misses than the staging holds go in waves, each expert read once; K slots per half
    is the least a decode call needs, and less is refused."""
    f = write_layer(tmp_path / "experts.bin", LAYERS["Q4_K|Q4_K|Q6_K"], rng)
    with whole_pool(f) as whole, tiered_pool(f, 0.0, staging_slots=K) as tiered:
        check_grouped_calls(whole, tiered, rng, 4, "staging of 2 x 4")
        info = tiered.file_info()
        assert info["staging_slots"] == K and info["staging_bytes"] > 0 and info["arena_bytes"] == 0
    with ExpertPool(N_EMBD, FF, K) as pool, pytest.raises(InvalidArgument, match="staging_slots 3"):
        pool.open_file(str(f.path), staging_slots=K - 1)


def test_buffered_reads_give_the_same_bits(tmp_path, rng):
    """Reads past the page cache without O_DIRECT (POSIX_FADV_DONTNEED after each) give the same output."""
    f = write_layer(tmp_path / "experts.bin", LAYERS["Q4_K|Q4_K|Q6_K"], rng)
    with whole_pool(f) as whole, tiered_pool(f, 0.3, direct=False) as tiered:
        info = tiered.file_info()
        assert not info["direct"] and "asked" in info["buffered_reason"]
        check_decode_calls(whole, tiered, rng, 6, "buffered")
        check_grouped_calls(whole, tiered, rng, 2, "buffered")
        assert tiered.file_info()["bytes_read"] > 0


def test_sizes_are_the_allocations(tmp_path, rng):
    """tier_sizes, the figure a plan takes before anything is allocated, is what a layer's arena takes."""
    f = write_layer(tmp_path / "experts.bin", LAYERS["Q4_K|Q4_K|Q6_K"], rng)
    slot, bounce = tier_sizes(0, f.matrices, N_EXPERT)
    assert slot >= whole_layer_bytes(f) // N_EXPERT and slot % 4096 == 0 and bounce > 0
    with tiered_pool(f, 0.5) as tiered:
        assert tiered.file_info()["arena_bytes"] == N_EXPERT // 2 * slot
        assert tiered.file_info()["staging_bytes"] >= 2 * K * (slot + bounce)


def whole_layer_bytes(f: LayerFile) -> int:
    return sum(w.nbytes if isinstance(w, np.ndarray) else sum(p.nbytes for p in w.planes().values())
               for w in f.weights)


def status_bytes(field: str) -> int:
    """A size field of /proc/self/status (VmRSS: resident, VmLck: page-locked) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/self/status")


def test_memory_is_what_the_figures_say(tmp_path, rng):
    """A tiered pool takes its arenas and its staging, page-locked where RLIMIT_MEMLOCK allows, and no more while
    it reads: what a RAM budget counts (strata.runtime.tiers) is what the process holds, and the reads leave
    nothing resident behind them (O_DIRECT)."""
    n_embd, ff, layers, k = 2048, 512, 2, 2
    f = write_layer(tmp_path / "experts.bin", LAYERS["Q4_K|Q4_K|Q6_K"], rng, n_embd=n_embd, ff=ff, repacked=False)
    slot, bounce = tier_sizes(0, f.matrices, N_EXPERT)
    slots = round(0.3 * N_EXPERT)
    figure = layers * slots * slot + 2 * k * (slot + bounce)
    everything = layers * N_EXPERT * slot
    rss, locked = status_bytes("VmRSS"), status_bytes("VmLck")
    with ExpertPool(n_embd, ff, k) as pool:
        pool.open_file(str(f.path), io_threads=3)
        for layer in range(layers):  # both layers read the same bytes: what is measured is the pool's memory
            pool.set_tiered_layer(layer, f.matrices, N_EXPERT, slots, list(range(slots)))
        info = pool.file_info()
        assert info["arena_bytes"] + info["staging_bytes"] == figure
        if info["arenas_locked"] and info["staging_locked"]:
            assert status_bytes("VmLck") - locked == figure
        grown = status_bytes("VmRSS") - rss
        for call in range(40):
            x = rng.standard_normal(n_embd, dtype=np.float32)
            ids = rng.choice(N_EXPERT, k, replace=False).astype(np.int32)
            pool.run_layer_sum(call % layers, x, ids, np.ones(k, np.float32))
        assert sum(s["misses"] for s in pool.tier_stats()) > 20
        after = status_bytes("VmRSS") - rss
        assert grown <= figure + (4 << 20) < everything, (grown, figure, everything)
        assert after - grown <= 2 << 20, f"the reads left {(after - grown) >> 20} MiB resident"


def poisoned_call(pool: ExpertPool, rng: np.random.Generator, ids: list[int]) -> None:
    x = rng.standard_normal(N_EMBD, dtype=np.float32)
    pool.run_layer_sum(0, x, np.array(ids, np.int32), np.ones(len(ids), np.float32),
                       out=np.full(N_EMBD, np.nan, np.float32))


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "buffered"])
def test_truncated_file_is_refused(tmp_path, rng, direct):
    f = write_layer(tmp_path / "experts.bin", LAYERS["Q4_K|Q4_K|Q6_K"], rng)
    with tiered_pool(f, 0.25, direct=direct, policy={"replace": False}) as tiered:
        poisoned_call(tiered, rng, [0, 1, 2, 3])  # every one in the arena: nothing read
        os.truncate(f.path, f.matrices[2].offset + 3 * f.matrices[2].stride)
        with pytest.raises(FormatError, match=f"{f.path.name}.*(file ends|changed)"):
            poisoned_call(tiered, rng, [0, 1, 14, 15])
        with pytest.raises(FormatError, match=f"{f.path.name}"):  # and every call after, even one of hits
            poisoned_call(tiered, rng, [0, 1])
        with pytest.raises(FormatError):
            x, experts, begin = grouped_call(rng)
            tiered.run_groups(0, x, experts, begin)


def test_rewritten_file_is_refused(tmp_path, rng):
    """A write into the file under the reader moves its modification time: the call that reads after it raises
    and says so, rather than compute with bytes that are no longer the model's."""
    f = write_layer(tmp_path / "experts.bin", LAYERS["Q4_K|Q4_K|Q6_K"], rng)
    os.utime(f.path, ns=(0, 0))  # so that the write below moves the time whatever the clock's granularity
    with tiered_pool(f, 0.25) as tiered:
        poisoned_call(tiered, rng, [8, 9])
        with open(f.path, "r+b") as out:
            out.seek(f.matrices[0].offset + 9 * f.matrices[0].stride)
            out.write(b"\x00" * 64)
        with pytest.raises(FormatError, match="changed while it was being read"):
            poisoned_call(tiered, rng, [10, 11])


def test_a_missing_or_short_file_fails_the_layer(tmp_path, rng):
    """Registering a tiered layer reads its arena's experts: a file too short for them fails there, naming the
    file, the layer, the expert and the offsets, and leaves the layer unregistered."""
    f = write_layer(tmp_path / "experts.bin", LAYERS["Q4_K|Q4_K|Q6_K"], rng)
    with ExpertPool(N_EMBD, FF, K) as pool, pytest.raises(FormatError, match="cannot open"):
        pool.open_file(str(tmp_path / "absent.gguf"))
    os.truncate(f.path, f.matrices[0].offset + 2 * f.matrices[0].stride)
    with ExpertPool(N_EMBD, FF, K) as pool:
        pool.open_file(str(f.path))
        with pytest.raises(FormatError, match=r"experts\.bin: layer 0 expert \d+ \w+ at bytes \d+\.\.\d+"):
            pool.set_tiered_layer(0, f.matrices, N_EXPERT, 8, list(range(8)))
        assert not pool.is_tiered(0) and pool.n_expert(0) == 0


def test_refusals_name_the_layer_and_matrix(tmp_path, rng):
    f = write_layer(tmp_path / "experts.bin", LAYERS["Q4_K|Q4_K|Q6_K"], rng)
    gate, up, down = f.matrices
    with ExpertPool(N_EMBD, FF, K) as pool:
        with pytest.raises(InvalidArgument, match="no expert file is open"):
            pool.set_tiered_layer(0, f.matrices, N_EXPERT, 2, [0, 1])
        pool.open_file(str(f.path))
        wrong = FileMatrix(down.form, down.rows, down.cols, int(T.Q8_0), down.offset, down.stride)
        with pytest.raises(InvalidArgument, match="layer 3 down: the file's ggml type 8 does not"):
            pool.set_tiered_layer(3, (gate, up, wrong), N_EXPERT, 2, [0, 1])
        short = FileMatrix(gate.form, gate.rows, gate.cols, gate.ggml_type, gate.offset, gate.stride - 1)
        with pytest.raises(InvalidArgument, match="layer 1 gate: file offset .* do not hold"):
            pool.set_tiered_layer(1, (short, up, down), N_EXPERT, 2, [0, 1])
        with pytest.raises(InvalidArgument, match="expert 1 to hold .* given twice"):
            pool.set_tiered_layer(0, f.matrices, N_EXPERT, 3, [1, 2, 1])
        pool.set_tiered_layer(0, f.matrices, N_EXPERT, 2, [0, 1])
        with pytest.raises(InvalidArgument, match="layer 0 is tiered"):  # the staging copies whole layers
            _native.ExpertStaging.bytes_for(pool.native, 1)
        assert _native.ExpertCache.bytes_for(pool.native, [1]) > 0  # the cache reads through the pool
        assert pool.is_tiered(0)


def test_lattice_types_are_not_tiered():
    assert {T.IQ2_XS, T.IQ3_S, T.IQ1_M}.isdisjoint(tier_types())
    assert set(TIER_TYPES) == set(tier_types())

