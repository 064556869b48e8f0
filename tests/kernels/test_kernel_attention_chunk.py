"""The chunk attention kernels of the prompt path (attention_prep_chunk, qsa_append_chunk, qsa_select_chunk,
attention_chunk) against their oracle: the decode kernels run once per token, in order, from the same cache
state on the same inputs (strata._native_check.attention_chunk_vs_decode), and against the numpy reference.

What the chunk leaves behind must be the decode's bit for bit, as it runs the same code with the same block
sizes: every byte of both KV cache halves in every KV format (cells never written keep the poison in both), the
q rows, the indexer's raw and pooled keys, and so every QSA selection. The attention output sums in another
order (tiles of 32 tokens in an online softmax, over the whole of a query's tokens or, in a short chunk, over
spans merged afterwards, where the decode merges 64 spans), so it is held to tolerances. attention_chunk has two
modes that must both give it: the scan (a block walks the union of a tile of queries' tokens by position) and
the gathered mode (a block reads one query's own tokens compacted, for queries past QSA's dense range).
"""

import numpy as np
import pytest

from strata.reference import kv_formats as kf
from strata.reference.attention import attend
from strata.reference.ops import rope_tables, sigmoid
from strata.reference.qsa import IndexerShape, pooled_block_keys
from support.compare import assert_same_bits

pytestmark = pytest.mark.hooks

EPS = 1e-6
THETA = 1e7
ROPE_DIM = 64
PAGE_SIZE = 8
# Each path's output is within RTOL of the float64 attention over the cache as stored, relative to the largest
# output element of the token (float32 dot products over <= 512 dims and an online softmax with a fast exp:
# ~1e-6 typical; the decode kernel's own test holds it to 1e-4). So the two paths are within 2 RTOL of each
# other.
RTOL = 1e-4
FORMATS = ["bf16", "int8", "q4", "k8v4"]
# (start, chunk): from position 0 and from inside a QSA block of 4 (6 = block 1 + 2), chunks of 1, a few, a
# multiple of the tile and the block, and one that is a multiple of neither (300 from 6 ends inside a block).
SPANS = [(0, 1), (0, 5), (0, 64), (0, 300), (6, 1), (6, 5), (6, 64), (6, 300)]


def random_inputs(rng, steps, heads, kv_heads, d):
    f = np.float32
    cos, sin = rope_tables(np.arange(steps), ROPE_DIM, THETA)
    n_pages = -(-steps // PAGE_SIZE) + 1  # one spare page, so the table is a real permutation
    return {
        "q_gate": rng.standard_normal((steps, heads, 2 * d), dtype=f),
        "k": rng.standard_normal((steps, kv_heads, d), dtype=f) * 2.0,
        "v": rng.standard_normal((steps, kv_heads, d), dtype=f),
        "q_norm": rng.uniform(0.5, 1.5, d).astype(f),
        "k_norm": rng.uniform(0.5, 1.5, d).astype(f),
        "cos": cos.astype(f),
        "sin": sin.astype(f),
        "pages": rng.permutation(n_pages).astype(np.int32),
    }


def random_indexer(rng, steps, keep, ratio, heads=4, d=128):
    """The QSA indexer's inputs: projections of normal entries, norm weights around 1."""
    rows = {"q": (steps, heads, d), "kraw": (steps, d)}
    indexer = {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in rows.items()}
    indexer.update({name: rng.uniform(0.5, 1.5, d).astype(np.float32) for name in ("q_norm", "k_norm")})
    return indexer | {"keep_blocks": keep, "ratio": ratio}


def run(inputs, start, kv, indexer=None, gathered=False):
    from strata import _native_check

    return _native_check.attention_chunk_vs_decode(
        inputs["q_gate"], inputs["k"], inputs["v"], inputs["q_norm"], inputs["k_norm"], inputs["cos"],
        inputs["sin"], inputs["pages"], start=start, page_size=PAGE_SIZE, kv=kv, eps=EPS, indexer=indexer,
        gathered=gathered)


def assert_same_state(got, label, qsa):
    """The chunk left exactly what the decode steps left."""
    a, b = got["stepwise"], got["at_once"]
    assert np.array_equal(a["k_bytes"], b["k_bytes"]), f"{label}: k cache bytes differ"
    assert np.array_equal(a["v_bytes"], b["v_bytes"]), f"{label}: v cache bytes differ"
    assert_same_bits(a["q"], b["q"], f"{label}: q rows")
    if not qsa:
        return
    # Bit patterns, NaN poison included: the cells neither path writes must stay poisoned in both.
    assert_same_bits(a["raw_keys"], b["raw_keys"], f"{label}: indexer raw keys", poisoned=True)
    assert_same_bits(a["block_keys"], b["block_keys"], f"{label}: indexer block keys", poisoned=True)
    assert np.array_equal(a["n_selected"], b["n_selected"]), f"{label}: selection counts differ"
    rows = np.nonzero(np.any(a["selected"] != b["selected"], axis=1))[0]
    assert rows.size == 0, f"{label}: selections differ first at chunk row {rows[:1]}"


def allowed_tokens(position, ratio, selected, n_selected):
    """The tokens a query at `position` attends: all (dense), or its selected blocks and its open tail."""
    if selected is None:
        return np.ones(position + 1, dtype=bool)
    mask = np.zeros(position + 1, dtype=bool)
    for b in selected[:n_selected]:
        mask[ratio * b:ratio * (b + 1)] = True
    mask[ratio * ((position + 1) // ratio):] = True
    return mask


def reference_rows(chunk, rng):
    """The chunk rows held to the numpy reference: all of a short chunk; of a long one (float64 attention over
    thousands of tokens per row is slow) its first and last 16 and 32 others at random."""
    if chunk <= 64:
        return np.arange(chunk)
    return np.unique(np.concatenate([np.arange(16), np.arange(chunk - 16, chunk), rng.integers(16, chunk - 16, 32)]))


def assert_outputs(got, inputs, start, kv, rng, ratio=4):
    """The chunk's output against the decode's on every row, and against numpy attention over its cache as
    stored (q and the cache in their bases, the sum rotated back where the values are rotated, then the gate)."""
    a, b = got["stepwise"], got["at_once"]
    d = inputs["k"].shape[2]
    rotated = kf.halves(kv)[1].rotated
    assert np.all(np.isfinite(b["out"])), f"{kv}: NaN or infinity in the chunk's output"
    assert np.all(np.isfinite(a["out"])), f"{kv}: NaN or infinity in the decode's output"
    scale = np.max(np.abs(a["out"]), axis=(1, 2))
    diff = np.max(np.abs(b["out"] - a["out"]), axis=(1, 2)) / scale
    assert np.all(diff < 2 * RTOL), f"{kv}: chunk vs decode relative difference {diff.max():.2e}"
    for row in reference_rows(b["out"].shape[0], rng):
        p = start + row
        selected = b["selected"][row] if "selected" in b else None
        allowed = allowed_tokens(p, ratio, selected, b["n_selected"][row] if selected is not None else 0)
        ref = attend(b["q"][row:row + 1], b["k_cache"][:, :p + 1], b["v_cache"][:, :p + 1], allowed[None, :])[0]
        want = (kf.rotate(ref) if rotated else ref) * sigmoid(inputs["q_gate"][p, :, d:])
        err = np.max(np.abs(b["out"][row] - want)) / np.max(np.abs(want))
        assert err < RTOL, f"{kv} position {p}: chunk attention relative error {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("kv", FORMATS)
@pytest.mark.parametrize("start, chunk", SPANS)
def test_dense_chunk_is_the_decode_steps(rng, kv, start, chunk):
    inputs = random_inputs(rng, start + chunk, 6, 2, 256)
    got = run(inputs, start, kv)
    label = f"{kv} start={start} chunk={chunk}"
    assert got["spans_scratch"] > 0, f"{label}: a chunk this short should cut its queries' tokens into spans"
    assert_same_state(got, label, qsa=False)
    assert_outputs(got, inputs, start, kv, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "q4"])
def test_long_dense_chunk_in_one_span(rng, kv):
    """A chunk whose query tiles fill the GPU runs each query's tokens as one span (no scratch, no merge)."""
    start, chunk = 100, 1400
    inputs = random_inputs(rng, start + chunk, 24, 2, 256)
    got = run(inputs, start, kv)
    label = f"{kv} start={start} chunk={chunk}"
    assert got["spans_scratch"] == 0, f"{label}: a chunk this long should need no spans"
    assert_same_state(got, label, qsa=False)
    assert_outputs(got, inputs, start, kv, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("gathered", [False, True])
@pytest.mark.parametrize("heads, kv_heads, d", [(24, 2, 256), (16, 2, 256), (4, 4, 128), (8, 1, 64),
                                                (6, 2, 96), (4, 2, 512), (3, 3, 320), (40, 2, 128)])
def test_dense_chunk_shapes(rng, heads, kv_heads, d, gathered):
    """qwen4exp's 24 q heads over 2 kv heads, qwen3next's 16 over 2, no grouping, one kv head, head sizes
    that are not powers of two or take the widest tiles, and a group past the gathered mode's two rows per warp
    (20 q heads per kv head); scanned and gathered (which runs a dense chunk too: each query reads 0..p)."""
    start, chunk = 9, 77
    inputs = random_inputs(rng, start + chunk, heads, kv_heads, d)
    for kv in ("bf16", "q4"):
        got = run(inputs, start, kv, gathered=gathered)
        label = f"{kv} {heads}/{kv_heads} heads of {d} gathered={gathered}"
        assert_same_state(got, label, qsa=False)
        assert_outputs(got, inputs, start, kv, rng)


def assert_indexer_reference(got, indexer, steps, ratio, keep):
    """The chunk's pooled block keys against the numpy pooling (float32 sums and norms against float64: ~1e-7),
    and none written past the blocks the tokens complete."""
    b = got["at_once"]
    nb = steps // ratio
    assert np.all(np.isnan(b["block_keys"][nb:])), "a block key past the complete blocks was written"
    if nb == 0:
        return
    shape = IndexerShape(indexer["q"].shape[1], indexer["q"].shape[2], ratio, ratio * keep, ROPE_DIM, THETA)
    want = pooled_block_keys(indexer["kraw"], nb, shape, indexer["k_norm"], EPS)
    err = np.max(np.abs(b["block_keys"][:nb] - want)) / np.max(np.abs(want))
    assert err < 1e-5, f"pooled block keys: relative error {err:.2e}"


def run_qsa(rng, kv, ratio, keep, start, chunk, heads, gathered=False):
    """The chunk with QSA on (`heads` q heads over 2 kv heads of 256) against the decode steps: the same state
    and selections, outputs within tolerance, and the chunk's block keys against numpy. Returns the selection
    counts of the chunk's queries and the spans attention_chunk cut their tokens into."""
    steps = start + chunk
    inputs = random_inputs(rng, steps, heads, 2, 256)
    indexer = random_indexer(rng, steps, keep, ratio)
    got = run(inputs, start, kv, indexer, gathered)
    label = f"{kv} ratio={ratio} keep={keep} start={start} chunk={chunk} gathered={gathered}"
    assert_same_state(got, label, qsa=True)
    assert_outputs(got, inputs, start, kv, rng, ratio)
    assert_indexer_reference(got, indexer, steps, ratio, keep)
    return got["at_once"]["n_selected"], got["spans"]


@pytest.mark.gpu
@pytest.mark.parametrize("kv", FORMATS)
@pytest.mark.parametrize("ratio", [4, 1, 3, 8])
@pytest.mark.parametrize("start, chunk", [(0, 1), (0, 5), (6, 5), (0, 64), (6, 64), (6, 300), (45, 300)])
def test_qsa_chunk_is_the_decode_steps(rng, kv, ratio, start, chunk):
    """A budget of 3 blocks, so the selection drops blocks from the 4th complete block on: chunks that begin and
    end inside a block, that complete several, and the block sizes a file may state."""
    keep = 3
    n_selected, _ = run_qsa(rng, kv, ratio, keep, start, chunk, heads=4)
    visible = (start + np.arange(chunk) + 1) // ratio
    assert np.array_equal(n_selected, np.minimum(keep, visible))


@pytest.mark.gpu
@pytest.mark.parametrize("gathered", [False, True])
@pytest.mark.parametrize("kv", ["bf16", "k8v4"])
@pytest.mark.parametrize("start, chunk", [(2000, 64), (1800, 300), (0, 2100)])
def test_qsa_chunk_past_the_dense_range(rng, kv, start, chunk, gathered):
    """qwen4exp's indexer: a budget of 2048 tokens (512 blocks of 4), 24 q heads over 2 kv heads; the chunks
    cross n = 2052 visible tokens, where the selection starts to drop blocks. The gathered mode takes the
    queries on both sides of it (a query in the dense range selects every complete block)."""
    n_selected, _ = run_qsa(rng, kv, 4, 512, start, chunk, heads=24, gathered=gathered)
    assert np.any(n_selected < (start + np.arange(chunk) + 1) // 4), "no block was dropped"


@pytest.mark.gpu
@pytest.mark.parametrize("kv", FORMATS)
@pytest.mark.parametrize("ratio", [4, 1, 3, 8])
@pytest.mark.parametrize("start, chunk, cut", [(1500, 5, True), (1200, 300, False)])
def test_gathered_chunk_deep_in_the_context(rng, kv, ratio, start, chunk, cut):
    """The gathered mode where the prompt path runs it: every query past the dense range. A budget of 16
    blocks among 150 to 1,500 complete ones, so each query's selection is sparse and, from random indexer
    inputs, random: its compacted tokens (16 blocks, then its open tail) lie scattered over the context. qwen4exp's
    24 q heads over 2 kv heads; a chunk of 5 queries (10 blocks) cuts each query's tokens into spans and merges
    them, one of 300 runs each in one span."""
    keep = 16
    n_selected, spans = run_qsa(rng, kv, ratio, keep, start, chunk, heads=24, gathered=True)
    visible = (start + np.arange(chunk) + 1) // ratio
    assert np.all(n_selected == keep) and np.all(visible > keep), "a query of the chunk is in the dense range"
    assert (spans > 1) == cut, f"the gathered chunk of {chunk} queries ran in {spans} spans"
