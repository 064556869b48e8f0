"""strata.reference blocks against float64 formulas written out as plain loops (HC, router, GDN, attention)."""

from __future__ import annotations

import math

import numpy as np

from strata.reference.attention import AttentionShape, KvState, gated_attention
from strata.reference.gdn import GdnShape, GdnState, delta_rule_step, gdn_forward
from strata.reference.hc import hc_read, hc_write
from strata.reference.moe import route
from strata.reference.ops import rope_tables
from strata.reference.weights import Weights

EPS = 1e-6
# Reference values are float32 at block boundaries; the loops run in float64. 1e-5 relative covers a few
# float32 roundings of O(1) values and is far below what a wrong formula gives.
RTOL, ATOL = 1e-5, 1e-6


def _sig(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


def _rms(v: list[float], w: list[float]) -> list[float]:
    s = math.sqrt(sum(a * a for a in v) / len(v) + EPS)
    return [a / s * b for a, b in zip(v, w)]


def _dot(row, v) -> float:
    return sum(float(a) * float(b) for a, b in zip(row, v))


def test_hc_read_write_and_final_mixer(rng: np.random.Generator) -> None:
    hc, n, rank, t = 4, 8, 3, 2
    w = {"p_norm.weight": 1 + 0.3 * rng.standard_normal(hc * n), "p_down.weight": rng.standard_normal((rank, hc * n)),
         "p_up.weight": rng.standard_normal((hc * n, rank)), "p_inject.weight": rng.standard_normal((hc, hc * n))}
    w = {k: v.astype(np.float32) for k, v in w.items()}
    streams = rng.standard_normal((t, hc, n)).astype(np.float32)
    x, inj = hc_read(Weights(w), "p", streams, EPS)
    x_final, none = hc_read(Weights(w), "p", streams, EPS, inject=False)
    assert none is None and np.array_equal(x, x_final)
    y = rng.standard_normal((t, n)).astype(np.float32)
    written = hc_write(streams, inj, y)
    for i in range(t):
        hn = []
        for k in range(hc):
            hn += _rms(list(streams[i, k]), list(w["p_norm.weight"][k * n:(k + 1) * n]))
        low = [_dot(r, hn) / hc for r in w["p_down.weight"]]
        low = [a * _sig(a) for a in low]
        gate = [_sig(_dot(r, low)) for r in w["p_up.weight"]]
        want_x = [sum(gate[k * n + j] * hn[k * n + j] for k in range(hc)) / hc for j in range(n)]
        want_inj = [2 * _sig(_dot(r, hn) / hc) for r in w["p_inject.weight"]]
        np.testing.assert_allclose(x[i], want_x, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(inj[i], want_inj, rtol=RTOL, atol=ATOL)
        for k in range(hc):
            np.testing.assert_allclose(written[i, k], streams[i, k] + want_inj[k] * y[i], rtol=RTOL, atol=ATOL)


def test_router_top_k_renormalised_ties_to_lower_index(rng: np.random.Generator) -> None:
    logits = rng.standard_normal((3, 16))
    logits[1, [2, 9, 12]] = 5.0            # a three-way tie at the top: top-2 must be experts 2 and 9
    ids, weights = route(logits, 4)
    for t in range(3):
        p = [math.exp(v) for v in logits[t]]
        p = [v / sum(p) for v in p]
        order = sorted(range(16), key=lambda e: (-p[e], e))[:4]
        assert list(ids[t]) == order, f"row {t}: {list(ids[t])} != {order}"
        total = sum(p[e] for e in order)
        np.testing.assert_allclose(weights[t], [p[e] / total for e in order], rtol=1e-6)
    assert list(ids[1][:3]) == [2, 9, 12]


def _gdn_weights(rng: np.random.Generator, shape: GdnShape, n: int) -> dict[str, np.ndarray]:
    hv, c = shape.n_v_heads, shape.conv_channels
    w = {"blk.0.attn_qkv.weight": rng.standard_normal((c, n)) / math.sqrt(n),
         "blk.0.attn_gate.weight": rng.standard_normal((hv * shape.head_v_dim, n)) / math.sqrt(n),
         "blk.0.ssm_conv1d.weight": rng.standard_normal((c, shape.conv_kernel)) / 2,
         "blk.0.ssm_dt.bias": rng.standard_normal(hv), "blk.0.ssm_a": -rng.uniform(0.1, 1.0, hv),
         "blk.0.ssm_norm.weight": 1 + 0.2 * rng.standard_normal(shape.head_v_dim),
         "blk.0.ssm_out.weight": rng.standard_normal((n, hv * shape.head_v_dim)) / math.sqrt(hv * shape.head_v_dim)}
    if shape.interleaved_ba:
        w["blk.0.ssm_ba.weight"] = rng.standard_normal((2 * hv, n)) / math.sqrt(n)
    else:
        w["blk.0.ssm_beta.weight"] = rng.standard_normal((hv, n)) / math.sqrt(n)
        w["blk.0.ssm_alpha.weight"] = rng.standard_normal((hv, n)) / math.sqrt(n)
    return {k: v.astype(np.float32) for k, v in w.items()}


def _gdn_loops(w: dict[str, np.ndarray], shape: GdnShape, xs: np.ndarray) -> np.ndarray:
    """The GDN layer per token, per head, per element (docs/models/qwen3next.md §3.1)."""
    hk, hv, dk, dv, kern = (shape.n_k_heads, shape.n_v_heads, shape.head_k_dim, shape.head_v_dim,
                            shape.conv_kernel)
    r = hv // hk
    c = shape.conv_channels
    raw_hist = [[0.0] * c for _ in range(kern - 1)]
    s = [[[0.0] * dv for _ in range(dk)] for _ in range(hv)]
    outs = []
    for x in xs:
        qkv = [_dot(row, x) for row in w["blk.0.attn_qkv.weight"]]
        z = [_dot(row, x) for row in w["blk.0.attn_gate.weight"]]
        if shape.interleaved_ba:
            ba = [_dot(row, x) for row in w["blk.0.ssm_ba.weight"]]
            b = [ba[(h // r) * 2 * r + h % r] for h in range(hv)]
            a = [ba[(h // r) * 2 * r + r + h % r] for h in range(hv)]
        else:
            b = [_dot(row, x) for row in w["blk.0.ssm_beta.weight"]]
            a = [_dot(row, x) for row in w["blk.0.ssm_alpha.weight"]]
        win = raw_hist + [qkv]
        conv = []
        for ch in range(c):
            v = sum(win[j][ch] * float(w["blk.0.ssm_conv1d.weight"][ch, j]) for j in range(kern))
            conv.append(v * _sig(v))
        raw_hist = win[1:]
        y = []
        for h in range(hv):
            kh = h % hk if shape.tiled_heads else h // r
            q = conv[kh * dk:(kh + 1) * dk]
            k = conv[hk * dk + kh * dk:hk * dk + (kh + 1) * dk]
            v = conv[2 * hk * dk + h * dv:2 * hk * dk + (h + 1) * dv]
            qn = math.sqrt(sum(e * e for e in q) + 1e-6)
            kn = math.sqrt(sum(e * e for e in k) + 1e-6)
            q = [e / qn / math.sqrt(dk) for e in q]
            k = [e / kn for e in k]
            sp = a[h] + float(w["blk.0.ssm_dt.bias"][h])
            g = float(w["blk.0.ssm_a"][h]) * (sp if sp > 20 else math.log1p(math.exp(sp)))
            beta = _sig(b[h])
            for i in range(dk):
                for j in range(dv):
                    s[h][i][j] *= math.exp(g)
            kv = [sum(s[h][i][j] * k[i] for i in range(dk)) for j in range(dv)]
            delta = [(v[j] - kv[j]) * beta for j in range(dv)]
            for i in range(dk):
                for j in range(dv):
                    s[h][i][j] += k[i] * delta[j]
            o = [sum(s[h][i][j] * q[i] for i in range(dk)) for j in range(dv)]
            zh = z[h * dv:(h + 1) * dv]
            act = [_sig(e) if shape.sigmoid_gate else e * _sig(e) for e in zh]
            y += [a_ * g_ for a_, g_ in zip(_rms(o, list(w["blk.0.ssm_norm.weight"])), act)]
        outs.append([_dot(row, y) for row in w["blk.0.ssm_out.weight"]])
    return np.array(outs)


def test_gdn_layer_all_three_layouts(rng: np.random.Generator) -> None:
    n = 12
    for tiled, interleaved, sigmoid_gate in [(False, True, False), (True, False, False), (True, False, True)]:
        shape = GdnShape(2, 6, 4, 3, 4, tiled_heads=tiled, interleaved_ba=interleaved, sigmoid_gate=sigmoid_gate)
        w = _gdn_weights(rng, shape, n)
        xs = rng.standard_normal((6, n)).astype(np.float32)
        state = GdnState(shape)
        got = np.concatenate([gdn_forward(Weights(w), 0, xs[:4], state, shape, EPS),
                              gdn_forward(Weights(w), 0, xs[4:], state, shape, EPS)])
        np.testing.assert_allclose(got, _gdn_loops(w, shape, xs), rtol=RTOL, atol=ATOL,
                                   err_msg=f"tiled={tiled} interleaved={interleaved} sigmoid={sigmoid_gate}")


def test_delta_rule_step_matches_outer_product_form(rng: np.random.Generator) -> None:
    h, dk, dv = 3, 4, 5
    s0 = rng.standard_normal((h, dk, dv))
    q, k, v = rng.standard_normal((h, dk)), rng.standard_normal((h, dk)), rng.standard_normal((h, dv))
    g, beta = -rng.uniform(0, 1, h), rng.uniform(0, 1, h)
    out, s1 = delta_rule_step(s0, q, k, v, g, beta)
    for i in range(h):
        s = s0[i] * math.exp(g[i])
        s = s + np.outer(k[i], (v[i] - s.T @ k[i]) * beta[i])
        np.testing.assert_allclose(s1[i], s, rtol=1e-12)
        np.testing.assert_allclose(out[i], s.T @ q[i], rtol=1e-12)


def test_gated_attention_with_selection(rng: np.random.Generator) -> None:
    n, h, hkv, d, rope = 10, 4, 2, 8, 4
    shape = AttentionShape(h, hkv, d)
    w = {"blk.0.attn_q.weight": rng.standard_normal((h * 2 * d, n)),
         "blk.0.attn_k.weight": rng.standard_normal((hkv * d, n)),
         "blk.0.attn_v.weight": rng.standard_normal((hkv * d, n)),
         "blk.0.attn_output.weight": rng.standard_normal((n, h * d)),
         "blk.0.attn_q_norm.weight": 1 + 0.2 * rng.standard_normal(d),
         "blk.0.attn_k_norm.weight": 1 + 0.2 * rng.standard_normal(d)}
    w = {k: (v / math.sqrt(v.shape[-1]) if v.ndim == 2 else v).astype(np.float32) for k, v in w.items()}
    xs = rng.standard_normal((7, n)).astype(np.float32)
    selected = rng.random((7, 7)) < 0.6
    cos, sin = rope_tables(np.arange(7), rope, 1e4)
    got = gated_attention(Weights(w), 0, xs, KvState(shape), shape, cos, sin, EPS, selected)

    def rope_vec(v: list[float], p: int) -> list[float]:
        out = list(v)
        for i in range(rope // 2):
            th = p * 1e4 ** (-2 * i / rope)
            a, b = v[i], v[i + rope // 2]
            out[i], out[i + rope // 2] = a * math.cos(th) - b * math.sin(th), b * math.cos(th) + a * math.sin(th)
        return out

    ks, vs = [], []
    for p, x in enumerate(xs):
        k = [_dot(r, x) for r in w["blk.0.attn_k.weight"]]
        ks.append([rope_vec(_rms(k[j * d:(j + 1) * d], list(w["blk.0.attn_k_norm.weight"])), p) for j in range(hkv)])
        vs.append([[_dot(r, x) for r in w["blk.0.attn_v.weight"]][j * d:(j + 1) * d] for j in range(hkv)])
    for p, x in enumerate(xs):
        qf = [_dot(r, x) for r in w["blk.0.attn_q.weight"]]
        o = []
        for head in range(h):
            q = rope_vec(_rms(qf[head * 2 * d:head * 2 * d + d], list(w["blk.0.attn_q_norm.weight"])), p)
            gate = qf[head * 2 * d + d:(head + 1) * 2 * d]
            j = head // (h // hkv)
            keys = [t for t in range(p + 1) if selected[p, t]]
            sc = [sum(a * b for a, b in zip(q, ks[t][j])) / math.sqrt(d) for t in keys]
            m = max(sc, default=0.0)
            e = [math.exp(v - m) for v in sc]
            a = [sum(e[i] * vs[t][j][c] for i, t in enumerate(keys)) / sum(e) if keys else 0.0 for c in range(d)]
            o += [a[c] * _sig(gate[c]) for c in range(d)]
        want = [_dot(r, o) for r in w["blk.0.attn_output.weight"]]
        np.testing.assert_allclose(got[p], want, rtol=RTOL, atol=ATOL, err_msg=f"position {p}")
