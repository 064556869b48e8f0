"""Gated attention over a paged KV cache in every KV format, the KV rotation and the QSA indexer on the GPU vs
the numpy reference.

The kernels run through one captured CUDA graph replayed per token with the position rewritten in device
memory, as the session runs them. The attention reference is fed the cache as the GPU stored it (bf16- or
int8-rounded, Q4 halves in their rotated basis), so the comparison isolates the kernel's arithmetic from the
storage rounding, which is checked on its own against strata.reference.kv_formats.
"""

import numpy as np
import pytest

from support.q8_form import assert_q8_of
from strata.reference import kv_formats as kf
from strata.reference.attention import attend
from strata.reference.ops import apply_rope, rms_norm, rope_tables, sigmoid
from strata.reference.qsa import IndexerShape, block_scores, pooled_block_keys, select_blocks

pytestmark = pytest.mark.hooks

EPS = 1e-6
THETA = 1e7
ROPE_DIM = 64
# float32 dot products over 256 dims and an online softmax with a fast exp, against float64: ~1e-6 typical;
# 1e-4 of the output scale as the brief states.
RTOL = 1e-4


def run(rng, steps, heads, kv_heads, d, page_size, kv="bf16", indexer=None, q8=False):
    from strata import _native_check

    f = np.float32
    inputs = {
        "q_gate": rng.standard_normal((steps, heads, 2 * d), dtype=f),
        "k": rng.standard_normal((steps, kv_heads, d), dtype=f) * 2.0,
        "v": rng.standard_normal((steps, kv_heads, d), dtype=f),
        "q_norm": rng.uniform(0.5, 1.5, d).astype(f),
        "k_norm": rng.uniform(0.5, 1.5, d).astype(f),
    }
    cos, sin = rope_tables(np.arange(steps), ROPE_DIM, THETA)
    inputs["cos"], inputs["sin"] = cos.astype(f), sin.astype(f)
    n_pages = -(-steps // page_size) + 1  # one spare page, so the table is a real permutation
    inputs["pages"] = rng.permutation(n_pages).astype(np.int32)
    got = _native_check.attention_steps(inputs["q_gate"], inputs["k"], inputs["v"], inputs["q_norm"], inputs["k_norm"],
                                  inputs["cos"], inputs["sin"], inputs["pages"], page_size=page_size,
                                  kv=kv, eps=EPS, indexer=indexer, q8=q8)
    return inputs, got


def reference_qk(inputs, d):
    """Normed, roped q [steps, H, d] and k [Hkv, steps, d] in float64, from the float32 rope table."""
    cos, sin = inputs["cos"].astype(np.float64), inputs["sin"].astype(np.float64)
    q = apply_rope(rms_norm(inputs["q_gate"][:, :, :d], inputs["q_norm"], EPS), cos, sin)
    k = apply_rope(rms_norm(inputs["k"], inputs["k_norm"], EPS), cos, sin)
    return q, k.transpose(1, 0, 2)


def check_outputs(got, inputs, d, allowed_rows, label, kv="bf16", steps=None):
    """Each step's output (of `steps`, default every step) against numpy attention over the cache as stored: q
    and the cache in their bases (rotated for Q4 halves), the sum rotated back (float64) before the gate."""
    values_rotated = kf.halves(kv)[1].rotated
    assert np.all(np.isfinite(got["out"])), f"{label}: NaN or infinity in the output"
    for t in range(inputs["q_gate"].shape[0]) if steps is None else steps:
        allowed = allowed_rows(t)
        a = attend(got["q"][t:t + 1], got["k_cache"][:, :t + 1], got["v_cache"][:, :t + 1], allowed[None, :])
        want = (kf.rotate(a[0]) if values_rotated else a[0]) * sigmoid(inputs["q_gate"][t, :, d:])
        err = np.max(np.abs(got["out"][t] - want)) / np.max(np.abs(want))
        assert err < RTOL, f"{label} step {t}: attention relative error {err:.2e}"


def assert_within_rounding(stored, exact, codes, label):
    """A scaled half as stored ([Hkv, steps, d]) against the float64 rows in the half's basis."""
    groups = exact.reshape(*exact.shape[:-1], -1, 32)
    step = np.abs(groups).max(axis=-1, keepdims=True) / codes.top
    # round(x / d) * d is within d / 2 of the GPU's own float32 row (q4: 0.5037 d where the fp16-rounded d
    # leaves amax past 7.5 d, kv_formats); d is fp16-rounded (relative 2^-11) and the float32 row is within
    # ~1e-6 of the float64 one, so 0.51 d holds every element.
    err = np.abs(stored.reshape(groups.shape) - groups)
    assert np.all(err <= 0.51 * step + 1e-7), f"{label}: {np.max(err / step):.3f} steps off"


def dense(t):
    return np.ones(t + 1, dtype=bool)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [32, 96, 192, 256, 320, 512])
def test_the_kv_rotation_kernel_is_the_numpy_rotation_bit_for_bit(rng, d):
    from strata import _native_check

    x = rng.standard_normal((300, d), dtype=np.float32) * 3.0
    got = _native_check.kv_rotate_rows(x)
    # the same float32 operations in the same order (kv_formats.rotate): equal bit for bit
    assert np.array_equal(got.view(np.uint32), kf.rotate(x).view(np.uint32)), f"d={d}"
    assert np.abs(kf.rotate(got.astype(np.float64)) - x).max() <= 1e-6 * np.abs(x).max()


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [4, 8])
def test_dense_attention_bf16(rng, page_size):
    steps, heads, kv_heads, d = 37, 4, 2, 256
    inputs, got = run(rng, steps, heads, kv_heads, d, page_size)
    q_ref, k_ref = reference_qk(inputs, d)
    err = np.max(np.abs(got["q"] - q_ref)) / np.max(np.abs(q_ref))
    assert err < 1e-5, f"q norm + rope relative error {err:.2e}"
    # bf16 keeps 8 significant bits: a stored key is within 2^-8 (relative) of the float32 value.
    assert np.all(np.abs(got["k_cache"] - k_ref) <= 2.0**-8 * np.abs(k_ref) + 1e-6), "k cache beyond bf16 rounding"
    assert np.array_equal(got["v_cache"], kf.bf16_round(inputs["v"].transpose(1, 0, 2))), "v cache is not bf16(v)"
    check_outputs(got, inputs, d, dense, f"bf16 page_size={page_size}")


@pytest.mark.gpu
@pytest.mark.parametrize("kv, d", [("int8", 128), ("q4", 256), ("q4", 96), ("q4", 192), ("q4", 512),
                                   ("k8v4", 128), ("k8v4", 320)])
def test_dense_attention_quantized(rng, kv, d):
    """The cache dequantizes to the numpy format of the rows (keys: within rounding of the float64 normed,
    roped rows; values, given exactly: bit for bit), q reaches the keys' basis, and the output is numpy
    attention over the stored rows, rotated back where the values are rotated."""
    steps, heads, kv_heads = 29, 6, 2
    inputs, got = run(rng, steps, heads, kv_heads, d, 8, kv=kv)
    key_codes, value_codes = kf.halves(kv)
    q_ref, k_ref = reference_qk(inputs, d)
    if key_codes.rotated:
        q_ref, k_ref = kf.rotate(q_ref), kf.rotate(k_ref)
    err = np.max(np.abs(got["q"] - q_ref)) / np.max(np.abs(q_ref))
    assert err < 1e-5, f"{kv}: q in the keys' basis, relative error {err:.2e}"
    assert_within_rounding(got["k_cache"], k_ref, key_codes, f"{kv} k cache")
    v = inputs["v"].transpose(1, 0, 2)
    assert np.array_equal(got["v_cache"], kf.cached(v, value_codes)), f"{kv}: v cache is not the numpy format of v"
    assert_within_rounding(got["v_cache"], kf.rotate(v.astype(np.float64)) if value_codes.rotated else v,
                           value_codes, f"{kv} v cache")
    check_outputs(got, inputs, d, dense, f"{kv} d={d}", kv)


@pytest.mark.gpu
@pytest.mark.parametrize("kv, d", [("bf16", 256), ("int8", 128), ("q4", 96), ("k8v4", 320)])
def test_attention_writes_the_q8_form_of_its_output(rng, kv, d):
    """attention_decode's merge writes the output's q8_32 form for attn_output beside it: every step's output is
    the same bits as without it (and numpy attention's, within RTOL), the form quantize_q8_32 of that output."""
    from strata import _native_check

    steps, heads, kv_heads = 13, 6, 2
    inputs, got = run(rng, steps, heads, kv_heads, d, 8, kv=kv, q8=True)
    plain = _native_check.attention_steps(inputs["q_gate"], inputs["k"], inputs["v"], inputs["q_norm"],
                                          inputs["k_norm"], inputs["cos"], inputs["sin"], inputs["pages"],
                                          page_size=8, kv=kv, eps=EPS)
    assert np.array_equal(got["out"].view(np.uint32), plain["out"].view(np.uint32)), f"{kv}: the q8 form changed out"
    check_outputs(got, inputs, d, dense, f"{kv} d={d} with q8", kv)
    for t in range(steps):
        assert_q8_of(got["out"][t], tuple(a[t] for a in got["q8"]), f"{kv} d={d} step {t}")


@pytest.mark.gpu
@pytest.mark.parametrize("ratio, kv", [(4, "bf16"), (1, "bf16"), (3, "bf16"), (8, "bf16"), (4, "q4"), (3, "k8v4")])
def test_qsa_attention_drops_blocks(rng, ratio, kv):
    """The released block of 4 tokens, and blocks a file may state: one token, a size that divides no KV page, 8;
    the rotated formats over the selection. The indexer's keys are f32 in every KV format."""
    heads, kv_heads, d, hi, di, keep = 4, 2, 256, 4, 128, 3
    steps = 11 * ratio + 1   # past the keep blocks by several, ending inside an open block
    indexer = indexer_inputs(rng, steps, hi, di, keep, ratio)
    inputs, got = run(rng, steps, heads, kv_heads, d, 8, kv=kv, indexer=indexer)
    assert check_selections(got, inputs, indexer, range(steps)), "no step dropped a block"
    check_outputs(got, inputs, d, lambda t: selected_rows(got, t, ratio), f"qsa {kv}", kv)


def indexer_inputs(rng, steps, heads, d, keep, ratio):
    """The QSA indexer's per-step inputs of `heads` query heads of d dims (attention_steps' `indexer`)."""
    f = np.float32
    return {
        "q": rng.standard_normal((steps, heads, d), dtype=f),
        "kraw": rng.standard_normal((steps, d), dtype=f),
        "q_norm": rng.uniform(0.5, 1.5, d).astype(f),
        "k_norm": rng.uniform(0.5, 1.5, d).astype(f),
        "keep_blocks": keep,
        "ratio": ratio,
    }


def selected_rows(got, t, ratio):
    """The tokens step t attends: its selected blocks' and its open tail's."""
    mask = np.zeros(t + 1, dtype=bool)
    for b in got["selected"][t, :got["n_selected"][t]]:
        mask[ratio * b:ratio * (b + 1)] = True
    mask[ratio * ((t + 1) // ratio):] = True
    return mask


def check_selections(got, inputs, indexer, steps) -> bool:
    """The block scores of `steps` against the float64 reference and the selections against the GPU's own scores
    (exactly) and the float64 ones where no near-tie; whether any of them dropped a block."""
    _, hi, di = indexer["q"].shape
    ratio, keep = indexer["ratio"], indexer["keep_blocks"]
    shape = IndexerShape(hi, di, ratio, ratio * keep, ROPE_DIM, THETA)
    cos, sin = inputs["cos"].astype(np.float64), inputs["sin"].astype(np.float64)
    dropped_any = False
    for t in steps:
        nb = (t + 1) // ratio
        n_sel = got["n_selected"][t]
        assert n_sel == min(keep, nb), f"step {t}: {n_sel} blocks selected, expected {min(keep, nb)}"
        if nb == 0:
            continue
        keys = pooled_block_keys(indexer["kraw"][:t + 1], nb, shape, indexer["k_norm"], EPS)
        q = apply_rope(rms_norm(indexer["q"][t:t + 1], indexer["q_norm"], EPS), cos[t:t + 1], sin[t:t + 1])
        want = block_scores(q[0], keys)
        scores = got["scores"][t, :nb]
        err = np.max(np.abs(scores - want)) / max(np.max(np.abs(want)), 1e-3)
        assert err < RTOL, f"step {t}: block score relative error {err:.2e}"
        # The selection is exact given the GPU's own scores; vs the float64 scores only where no near-tie.
        chosen = got["selected"][t, :n_sel]
        assert np.array_equal(chosen, select_blocks(scores.astype(np.float64), min(keep, nb))), f"step {t}"
        ordered = np.sort(want)[::-1]
        if nb > keep and ordered[keep - 1] - ordered[keep] > 1e-3 * ordered[0]:
            assert np.array_equal(chosen, select_blocks(want, keep)), f"step {t}: selection differs from float64"
        dropped_any |= nb > keep
    return dropped_any


KV_FORMATS = ["bf16", "int8", "q4", "k8v4"]


@pytest.mark.gpu
@pytest.mark.parametrize("kv", KV_FORMATS)
@pytest.mark.parametrize("heads", [24, 10])
def test_decode_early_in_a_context(rng, kv, heads):
    """qwen4exp's 24 q heads over 2 kv heads of 256 (three blocks of 4 q heads per kv head), and 10 (blocks of 4
    and 1), for the first 24 tokens: every step within one span of one tile."""
    steps, kv_heads, d = 24, 2, 256
    inputs, got = run(rng, steps, heads, kv_heads, d, 16, kv=kv)
    check_outputs(got, inputs, d, dense, f"{kv} {heads} heads", kv)


# The steps of a 3,000-token run that are checked against numpy (every one would take minutes), by the tokens
# they see: the first, where spans of 32 tokens become two (33) and 64-token spans begin (2,049), the last without
# a dropped block (2,051) and the first with one (2,052), and a spread to the end.
LONG_STEPS = [0, 31, 32, 33, 1000, 2047, 2048, 2049, 2050, 2051, 2052, 2100, 2500, 2998, 2999]


@pytest.mark.gpu
@pytest.mark.parametrize("kv", KV_FORMATS)
def test_decode_at_3000_tokens_with_qsa(rng, kv):
    """qwen4exp's attention and indexer (512 blocks of 4 tokens kept) over 3,000 tokens: from 2,052 tokens on
    every step drops blocks and attends 2,048 to 2,051 tokens over spans of 64 (two tiles each)."""
    steps, heads, kv_heads, d = 3000, 24, 2, 256
    indexer = indexer_inputs(rng, steps, 4, 128, 512, 4)
    inputs, got = run(rng, steps, heads, kv_heads, d, 16, kv=kv, indexer=indexer)
    assert check_selections(got, inputs, indexer, LONG_STEPS), "no checked step dropped a block"
    check_outputs(got, inputs, d, lambda t: selected_rows(got, t, 4), f"qsa 3000 {kv}", kv, LONG_STEPS)


@pytest.mark.gpu
def test_dense_decode_at_3000_tokens(rng):
    """Dense attention past 2,048 tokens: spans of 64 tokens, two tiles of 32 each, over every token."""
    steps, heads, kv_heads, d = 3000, 24, 2, 256
    inputs, got = run(rng, steps, heads, kv_heads, d, 16, kv="int8")
    check_outputs(got, inputs, d, dense, "dense 3000 int8", "int8", LONG_STEPS)


@pytest.mark.gpu
@pytest.mark.parametrize("n, keep", [(3000, 1), (3000, 7), (3000, 512), (3000, 2999), (3000, 3000), (3000, 5000),
                                     (33, 5), (750, 512), (4099, 512), (8192, 512), (8193, 8000), (65536, 512)])
def test_qsa_top_blocks_ties_go_to_lower_index(rng, n, keep):
    """3000 blocks, and past a warp's range (33), at 3,000 tokens (750), past the 1,024 threads' first stride
    (4099), all of them and one past the scores kept in shared memory (8192, 8193), and at 262,144 tokens (65,536
    blocks: each warp of the selection walks 2,048)."""
    from strata import _native_check

    scores = rng.integers(-2, 5, n).astype(np.float32)  # many exact ties, a few negative values
    scores[rng.integers(0, n, 50)] = rng.standard_normal(50, dtype=np.float32) * 10
    scores[rng.integers(0, n, 8)] = -0.0  # equal to +0 in the order
    got = _native_check.qsa_top_blocks(scores, keep)
    want = select_blocks(scores.astype(np.float64), min(keep, n))
    assert np.array_equal(got, want), f"keep={keep}: first differences at {np.nonzero(got[:len(want)] != want)[0][:5]}"


@pytest.mark.gpu
def test_qsa_top_blocks_of_nearby_scores_deep_in_a_context(rng):
    """Scores as the indexer leaves them (sums of ReLUs: positive, most of them sharing their top bits) over 65,536
    blocks: the histogram passes see long runs of one digit."""
    from strata import _native_check

    scores = (1.0 + 0.01 * rng.standard_normal(65536)).astype(np.float32)
    got = _native_check.qsa_top_blocks(scores, 512)
    assert np.array_equal(got, select_blocks(scores.astype(np.float64), 512))
