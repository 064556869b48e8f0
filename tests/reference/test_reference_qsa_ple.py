"""strata.reference QSA selection and PLE against float64 / Python-int formulas written out as loops."""

from __future__ import annotations

import math

import numpy as np

from strata import models
from strata.reference.ops import rope_tables
from strata.models import PleShape
from strata.reference.ple import PleState, ngram_context, ngram_rows, ple_forward
from strata.reference.qsa import IndexerShape, IndexerState, block_scores, pooled_block_keys, qsa_select, select_blocks
from strata.reference.weights import Weights

EPS = 1e-6
RTOL, ATOL = 1e-5, 1e-6   # float32 block boundaries against float64 loops
MASK64 = (1 << 64) - 1


def _sig(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


def _rms(v, w) -> list[float]:
    s = math.sqrt(sum(float(a) ** 2 for a in v) / len(v) + EPS)
    return [float(a) / s * float(b) for a, b in zip(v, w)]


def _rope(v: list[float], p: int, rope: int, theta: float) -> list[float]:
    out = list(v)
    for i in range(rope // 2):
        th = p * theta ** (-2 * i / rope)
        a, b = v[i], v[i + rope // 2]
        out[i], out[i + rope // 2] = a * math.cos(th) - b * math.sin(th), b * math.cos(th) + a * math.sin(th)
    return out


def test_pooled_keys_and_scores(rng: np.random.Generator) -> None:
    shape = IndexerShape(n_heads=3, head_dim=8, ratio=4, budget=8, rope_dim=4, rope_theta=1e4)
    raw = rng.standard_normal((22, 8)).astype(np.float32)
    k_norm = (1 + 0.2 * rng.standard_normal(8)).astype(np.float32)
    keys = pooled_block_keys(raw, 5, shape, k_norm, EPS)
    q = rng.standard_normal((3, 8))
    scores = block_scores(q, keys)
    for b in range(5):
        mean = [sum(float(raw[4 * b + i, c]) for i in range(4)) / 4 for c in range(8)]
        want = _rope(_rms(mean, k_norm), 4 * b, 4, 1e4)
        np.testing.assert_allclose(keys[b], want, rtol=RTOL, atol=ATOL)
        want_score = sum(max(0.0, sum(q[h, c] * want[c] for c in range(8))) for h in range(3)) / math.sqrt(8)
        np.testing.assert_allclose(scores[b], want_score, rtol=RTOL, atol=ATOL)


def test_select_blocks_ties_to_lower_index() -> None:
    assert list(select_blocks(np.array([0.0, 2.0, 0.0, 1.0, 0.0]), 3)) == [0, 1, 3]
    assert list(select_blocks(np.array([1.0, 1.0, 1.0]), 2)) == [0, 1]


def test_qsa_selection_with_budget_overflow_and_empty_tail(rng: np.random.Generator) -> None:
    n, heads, d = 10, 2, 8
    shape = IndexerShape(n_heads=heads, head_dim=d, ratio=4, budget=8, rope_dim=4, rope_theta=1e4)
    w = {"blk.0.indexer.q_proj.weight": rng.standard_normal((heads * d, n)),
         "blk.0.indexer.k_proj.weight": rng.standard_normal((d, n)),
         "blk.0.indexer.q_norm.weight": 1 + 0.2 * rng.standard_normal(d),
         "blk.0.indexer.k_norm.weight": 1 + 0.2 * rng.standard_normal(d)}
    w = {k: v.astype(np.float32) for k, v in w.items()}
    xs = rng.standard_normal((27, n)).astype(np.float32)
    state = IndexerState(shape)
    rows, blocks = [], []
    for lo, hi in [(0, 13), (13, 14), (14, 27)]:          # a prompt chunk, one decode step, another chunk
        pos = np.arange(lo, hi)
        cos, sin = rope_tables(pos, 4, 1e4)
        sel, chosen, _ = qsa_select(Weights(w), 0, xs[lo:hi], pos, state, shape, cos, sin, EPS)
        rows += [np.pad(r, (0, 27 - r.size)) for r in sel]
        blocks += chosen
    raw = [[float(v) for v in row] for row in (xs.astype(np.float64) @ w["blk.0.indexer.k_proj.weight"].T)]
    for p in range(27):
        nb = (p + 1) // 4
        qf = [sum(float(a) * float(b) for a, b in zip(r, xs[p])) for r in w["blk.0.indexer.q_proj.weight"]]
        q = [_rope(_rms(qf[h * d:(h + 1) * d], w["blk.0.indexer.q_norm.weight"]), p, 4, 1e4) for h in range(heads)]
        scores = []
        for b in range(nb):
            mean = [sum(raw[4 * b + i][c] for i in range(4)) / 4 for c in range(d)]
            key = _rope(_rms(mean, w["blk.0.indexer.k_norm.weight"]), 4 * b, 4, 1e4)
            scores.append(sum(max(0.0, sum(a * c for a, c in zip(qh, key))) for qh in q) / math.sqrt(d))
        top = sorted(sorted(range(nb), key=lambda b: (-scores[b], b))[:min(2, nb)])
        want = {t for b in top for t in range(4 * b, 4 * b + 4)} | set(range(4 * nb, p + 1))
        assert list(blocks[p]) == top, f"position {p}: blocks {list(blocks[p])} != {top}"
        assert set(np.nonzero(rows[p])[0]) == want, f"position {p}"
    # position 11 has an empty tail (12 visible tokens, 3 blocks): only the 2 best blocks, maybe not its own
    assert rows[11].sum() == 8


def _splitmix64(v: int) -> int:
    v = (v + 0x9E3779B97F4A7C15) & MASK64
    v = ((v ^ (v >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    v = ((v ^ (v >> 27)) * 0x94D049BB133111EB) & MASK64
    return v ^ (v >> 31)


def _primes_from(start: int, count: int) -> list[int]:
    out, v = [], start
    while len(out) < count:
        if v > 1 and all(v % f for f in range(2, math.isqrt(v) + 1)):
            out.append(v)
        v += 1
    return out


def test_released_ple_constants_follow_the_formula() -> None:
    """docs/models/qwen4exp.md §3(d): seed 1234, ple_idx 0, vocab 248320, primes >= 20 000 000."""
    g = models.released("qwen4exp")
    half = ((2**63 - 1) // 248320) // 2
    mult = [2 * (_splitmix64((1234 + 0x9E3779B97F4A7C15 * (i + 1)) & MASK64) % half) + 1 for i in range(3)]
    assert tuple(g.ple_multipliers) == tuple(mult)
    sizes = _primes_from(20_000_000, 16)
    assert tuple(g.ple_head_sizes) == tuple(sizes)
    assert tuple(g.ple_head_offsets) == tuple(sum(sizes[:h]) for h in range(16))


def test_ngram_context_and_rows(rng: np.random.Generator) -> None:
    eos = 5
    ids = rng.integers(0, 12, 40)
    ids[[0, 7, 8, 20]] = eos
    prev = np.array([3, eos])
    ctx = np.concatenate([ngram_context(prev, ids[:17], eos), ngram_context(ids[15:17], ids[17:], eos)])
    hist = list(prev) + list(ids)
    for t in range(40):
        p = t + 2
        want = [hist[p]]
        for s in (1, 2):
            cut = any(hist[p - j] == eos for j in range(1, s + 1))
            want.append(eos if cut else hist[p - s])
        assert list(ctx[t]) == want, f"token {t}: {list(ctx[t])} != {want}"
    g = models.released("qwen4exp")
    shape = PleShape(3, 8, 4, 4, eos, tuple(g.ple_multipliers), tuple(g.ple_head_offsets), tuple(g.ple_head_sizes))
    big = rng.integers(0, 248320, (6, 3))
    rows = ngram_rows(big, shape)
    m = g.ple_multipliers
    for t in range(6):
        c = [int(v) for v in big[t]]
        mix2 = ((c[0] * m[0]) & MASK64) ^ ((c[1] * m[1]) & MASK64)
        mix3 = mix2 ^ ((c[2] * m[2]) & MASK64)
        want = [(mix2 if h < 8 else mix3) % g.ple_head_sizes[h] + g.ple_head_offsets[h] for h in range(16)]
        assert list(rows[t]) == want


def test_ple_block_lookup_gate_and_dilated_conv(rng: np.random.Generator) -> None:
    hc, n, hd, eos = 2, 16, 1, 3          # 16 heads x 1 = 16 = n
    sizes = [11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71]
    shape = PleShape(3, 8, hd, 4, eos, (7, 11, 13), tuple(sum(sizes[:h]) for h in range(16)), tuple(sizes))
    w = {"per_layer_token_embd.weight": rng.standard_normal((sum(sizes), hd)),
         "blk.1.ple_key.weight": rng.standard_normal((hc * n, 16)) / 4,
         "blk.1.ple_value.weight": rng.standard_normal((n, 16)) / 4,
         "blk.1.ple_norm_key.weight": 1 + 0.2 * rng.standard_normal(hc * n),
         "blk.1.ple_norm_query.weight": 1 + 0.2 * rng.standard_normal(hc * n),
         "blk.1.ple_norm_conv.weight": 1 + 0.2 * rng.standard_normal(hc * n),
         "blk.1.ple_conv1d.weight": rng.standard_normal((hc * n, 4)) / 2}
    w = {k: v.astype(np.float32) for k, v in w.items()}
    ids = rng.integers(0, 9, 14)
    ids[4] = eos
    streams = rng.standard_normal((14, hc, n)).astype(np.float32)
    state = PleState(shape, hc * n)
    got = np.concatenate([ple_forward(Weights(w), 1, streams[:9], ids[:9], state, shape, EPS),
                          ple_forward(Weights(w), 1, streams[9:], ids[9:], state, shape, EPS)])
    normed_rows = []
    for t in range(14):
        rows = ngram_rows(ngram_context(np.array([eos, eos] + list(ids[:t]))[-2:], ids[t:t + 1], eos), shape)[0]
        e = [float(v) for r in rows for v in w["per_layer_token_embd.weight"][r]]
        key = [sum(a * b for a, b in zip(r, e)) for r in w["blk.1.ple_key.weight"]]
        value = [sum(a * b for a, b in zip(r, e)) for r in w["blk.1.ple_value.weight"]]
        gated = []
        for k in range(hc):
            kn = _rms(key[k * n:(k + 1) * n], w["blk.1.ple_norm_key.weight"][k * n:(k + 1) * n])
            qn = _rms(streams[t, k], w["blk.1.ple_norm_query.weight"][k * n:(k + 1) * n])
            s = sum(a * b for a, b in zip(kn, qn)) / math.sqrt(n)
            s = math.copysign(math.sqrt(max(abs(s), 1e-6)), s) if s != 0 else 0.0
            gated += [_sig(s) * v for v in value]
        normed = []
        for k in range(hc):
            normed += _rms(gated[k * n:(k + 1) * n], w["blk.1.ple_norm_conv.weight"][k * n:(k + 1) * n])
        normed_rows.append(normed)
        conv = []
        for c in range(hc * n):
            acc = sum(float(w["blk.1.ple_conv1d.weight"][c, j]) * normed_rows[t - 3 * (3 - j)][c]
                      for j in range(4) if t - 3 * (3 - j) >= 0)
            conv.append(acc * _sig(acc))
        np.testing.assert_allclose(got[t].reshape(-1), [a + b for a, b in zip(gated, conv)], rtol=RTOL, atol=ATOL,
                                   err_msg=f"token {t}")
