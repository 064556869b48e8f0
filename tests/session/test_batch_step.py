"""Batched decode steps on the GPU (docs/batch.md, docs/rows.md): DecodeSession.step_batch runs one token of each of
several sessions through every layer and the LM head at once, a step of one-row spans on the first one's prompt
program. A batch's row is, bit for bit, that session stepped in a batch of one (each kernel's row independent of the
others' where the dense products are GEMV batches of at most 8 rows), for all three architectures, at different
positions and sampling settings; decoding after it goes on from that state; a batch of more rows than one GEMV
batch takes stays within the decode bounds; and the greedy tokens of sessions decoded together are those each
decodes alone, up to a near-tie. (With the prompt path's CPU share off, a chunk's experts run on the GPU; a batch's
that the VRAM cache lacks go to the CPU pool through the step's doorbell, one ring a MoE layer for all its rows.)"""

import numpy as np
import pytest

from strata import _native
from strata.errors import InvalidArgument
from strata.options import Mode
from strata.runtime.engine import GpuEngine

from support.compare import assert_same_bits, relative_errors
from support.native_session import GREEDY, half_cache, open_native_session, whole_cache
from test_decode_session import GARBAGE, STEADY
from test_prompt_path import bounds, loaded, prompt_ids, rows_of, staging  # noqa: F401 (loaded: a fixture)

pytestmark = pytest.mark.gpu

CONTEXT = 256
SAMPLED = (0.8, 40, 0.95, 0.02, 1.1)  # temperature, top_k, top_p, min_p, repeat_penalty


def engine(model, staged, *, chunk=16, kv="bf16", mode=Mode.TOKEN_GRAPH, key="model", **options):
    native = open_native_session(model, context=CONTEXT, kv=kv, mode=mode, prompt_chunk=chunk, staging=staged,
                                 prompt_cpu=False, **options)
    return GpuEngine(native, rows_of(model), batch_key=key)


def fed(e, ids):
    e.prefill(ids, [0] * (e.position + len(ids)))


def batch(engines, ids, params=None, us=None):
    params = params or [GREEDY] * len(engines)
    us = us or [0.0] * len(engines)
    rows = [e.ple.rows(t) if e.ple is not None else None for e, t in zip(engines, ids)]
    return _native.step_batch([e.native for e in engines], ids, rows if rows[0] is not None else None, params, us)


def alone(e, token, params=GREEDY, u=0.0):
    """The token through a batch of one."""
    return batch([e], [token], [params], [u])[0]


def scored(e, token):
    """The token through the prompt path alone (GpuEngine.score): its logits row, as feed's every-position logits."""
    return e.score([token], [0] * (e.position + 1))[0]


def pairs(model, rng, lengths, staged_batch, staged_alone, **options):
    """Sessions at the prompts' ends (one per length), in the batch's staging, and their twins in another."""
    prompts = [prompt_ids(model, rng, n) for n in lengths]
    together = [engine(model, staged_batch, **options) for _ in prompts]
    apart = [engine(model, staged_alone, **options) for _ in prompts]
    for prompt, a, b in zip(prompts, together, apart):
        fed(a, prompt)
        fed(b, prompt)
    return together, apart


def close(*groups):
    for group in groups:
        for e in group:
            e.close()


@pytest.mark.parametrize("lengths", [[9], [21, 7, 14], [9, 30, 17, 11, 26, 8, 7, 19]])
def test_a_batch_row_is_its_session_alone(loaded, lengths, rng):
    name, model = loaded
    g = model.info.geometry
    together, apart = pairs(model, rng, lengths, staging(model), staging(model))
    try:
        for step in range(3):
            ids = [int(t) for t in rng.integers(0, g.n_vocab, len(lengths))]
            params = [GREEDY if i % 2 == 0 else SAMPLED for i in range(len(ids))]
            us = [float(u) for u in rng.random(len(ids))]
            got = batch(together, ids, params, us)
            want = [alone(e, t, p, u) for e, t, p, u in zip(apart, ids, params, us)]
            for i, (a, b) in enumerate(zip(together, apart)):
                assert a.position == b.position == lengths[i] + step + 1
                logits = a.logits()
                assert np.all(np.isfinite(logits)), (name, i)
                assert_same_bits(logits, b.logits(), f"{name} step {step} row {i}: logits")
            assert got == want, (name, step, got, want)
        # the state each row left decodes on as its twin's
        then = [int(t) for t in rng.integers(0, g.n_vocab, 3)]
        for a, b in zip(together, apart):
            alone(a, then[0])
            alone(b, then[0])
            assert_same_bits(a.logits(), b.logits(), f"{name}: a batch of one after the batch")
            for t in then[1:]:
                a.prefill([t], [0] * (a.position + 1))
                b.prefill([t], [0] * (b.position + 1))
                assert_same_bits(a.logits(), b.logits(), f"{name}: decoding after the batch")
    finally:
        close(together, apart)


def test_a_batch_in_every_mode_and_kv_format(loaded, rng):
    name, model = loaded
    g = model.info.geometry
    for mode, kv in [(Mode.UNCAPTURED, "int8"), (Mode.LAYER_GRAPHS, "q4"), (Mode.TOKEN_GRAPH, "bf16")]:
        together, apart = pairs(model, rng, [12, 8, 7], staging(model), staging(model), mode=mode, kv=kv)
        try:
            ids = [int(t) for t in rng.integers(0, g.n_vocab, 3)]
            assert batch(together, ids) == [alone(e, t) for e, t in zip(apart, ids)]
            for a, b in zip(together, apart):
                assert_same_bits(a.logits(), b.logits(), f"{name} {mode} {kv}")
                # the session steps on after the batch, in its own mode, from the same state
                t = int(rng.integers(0, g.n_vocab))
                a.prefill([t], [0] * (a.position + 1))
                b.prefill([t], [0] * (b.position + 1))
                assert_same_bits(a.logits(), b.logits(), f"{name} {mode} {kv}: a step after the batch")
        finally:
            close(together, apart)


def test_a_batch_larger_than_the_gemv_rows_stays_within_the_decode_bounds(loaded, rng):
    """12 rows (two GEMV batches for each dense product) against each session's token through the prompt path, whose
    attention is the chunk's own kernel: within the decode bounds."""
    name, model = loaded
    g = model.info.geometry
    lengths = [int(n) for n in rng.integers(7, 40, 12)]
    together, apart = pairs(model, rng, lengths, staging(model), staging(model))
    try:
        ids = [int(t) for t in rng.integers(0, g.n_vocab, 12)]
        batch(together, ids)
        want = [scored(e, t) for e, t in zip(apart, ids)]
        errors = relative_errors([e.logits() for e in together], want)
        print(f"{name}: 12 rows against each alone, median {np.median(errors):.2e}, worst {errors.max():.2e}")
        assert np.all(np.isfinite(errors))
        assert np.median(errors) < bounds(name, "bf16"), (name, errors)
        assert np.quantile(errors, 0.9) < STEADY and errors.max() < GARBAGE, (name, errors)
    finally:
        close(together, apart)


# A session's row in a step of several is, bit for bit, its row in a step of one (docs/rows.md, "Exactness"), so the
# tests of batched sessions compare tokens with the same session stepped alone through steps of one row: exactly,
# at every step. Plain decode steps (the decode program) differ from the rows within the decode bounds, and a
# routing near-tie can then flip an expert and move later logits past any margin (the batcher's test failed so on
# qwen35moe-f32, H100, 2026-12-06); the rows' bounds against plain steps are the tests' that say "decode bounds".
def rows_alone(model, prompt, n):
    """The greedy tokens of one session fed `prompt`, then stepped n - 1 times as steps of one row."""
    session = model.session(CONTEXT, kv="bf16", prompt_cpu=False)
    try:
        e = session.engine
        history = list(prompt)
        out = [e.feed(prompt, session_params(), 0.0, history)]
        while len(out) < n:
            history.append(out[-1])
            out.append(GpuEngine.step_batch([e], [out[-1]], [session_params()], [0.0], [list(history)])[0])
        return out
    finally:
        session.close()


def session_params():
    from strata.sampling import SamplingParams
    return SamplingParams()


def test_sessions_decoded_together_yield_the_tokens_each_decodes_alone(loaded, rng):
    """Four Model sessions, prompts of different lengths, decoded greedily in batches through GpuEngine.step_batch
    against each stepped alone in steps of one row: the same tokens, every one."""
    name, model = loaded
    prompts = [prompt_ids(model, rng, n) for n in (7, 19, 12, 9)]
    want = [rows_alone(model, p, 17) for p in prompts]
    sessions = [model.session(CONTEXT, kv="bf16", prompt_cpu=False) for _ in prompts]
    try:
        engines = [s.engine for s in sessions]
        assert len({e.batch_key for e in engines}) == 1 and engines[0].batch_key is not None
        histories = [list(p) for p in prompts]
        tokens = [e.feed(p, session_params(), 0.0, h) for e, p, h in zip(engines, prompts, histories)]
        got = [[] for _ in prompts]
        for _ in range(16):
            for i, t in enumerate(tokens):
                got[i].append(t)
                histories[i].append(t)
            tokens = GpuEngine.step_batch(engines, tokens, [session_params()] * 4, [0.0] * 4,
                                          [list(h) for h in histories])
        for i, tokens_alone in enumerate(want):
            assert got[i] + [tokens[i]] == tokens_alone, (name, i, got[i] + [tokens[i]], tokens_alone)
        stats = engines[1].stats()
        assert stats["batch_tokens"] == 16 and stats["batch_steps"] == 0
        assert engines[0].stats()["batch_steps"] == 16
    finally:
        for s in sessions:
            s.close()


def test_refusals_leave_every_session_as_it_was(loaded, rng):
    name, model = loaded
    g = model.info.geometry
    staged = staging(model)
    small = engine(model, staged, chunk=2)  # made first, so it leads any step it is in (the lowest serial)
    a, b = engine(model, staged), engine(model, staged)
    short = GpuEngine(open_native_session(model, context=128, kv="bf16", prompt_chunk=16, staging=staged,
                                          prompt_cpu=False), rows_of(model), batch_key="short")
    other_kv = engine(model, staged, kv="int8")
    apart = engine(model, staging(model))
    engines = [a, b, short, other_kv, small, apart]
    try:
        for e in engines:
            fed(e, prompt_ids(model, rng, 9))
        t = int(rng.integers(0, g.n_vocab))
        refusals = {
            "the same session twice": [a, a],
            "another context": [a, short],
            "another KV format": [a, other_kv],
            "more rows than the leader's chunk": [a, b, small],
            "another staging": [a, apart],
        }
        for what, members in refusals.items():
            with pytest.raises(InvalidArgument):
                batch(members, [t] * len(members))
            assert all(e.position == 9 for e in engines), what
        with pytest.raises(InvalidArgument, match="outside the vocabulary"):
            batch([a, b], [t, g.n_vocab])
        assert a.position == b.position == 9
        # both still step, together, after the refusals
        batch([a, b], [t, t])
        assert a.position == b.position == 10
    finally:
        close(engines)
    if g.attention_layers and g.indexer_head_dim:  # KV streaming serves qwen4exp's indexed attention only
        staged = staging(model)
        s1 = engine(model, staged)
        s2 = engine(model, staged, kv_streaming=True)
        try:
            fed(s1, [1, 2, 3])
            fed(s2, [1, 2, 3])
            with pytest.raises(InvalidArgument, match="streams its KV"):
                batch([s1, s2], [4, 4])
            assert s1.position == s2.position == 3
        finally:
            close([s1, s2])


def cached_engines(model, cache, count, mode):
    return [engine(model, None, cache=cache, mode=mode) for _ in range(count)]


@pytest.mark.parametrize("mode", [Mode.UNCAPTURED, Mode.TOKEN_GRAPH])
def test_a_batch_of_cached_experts_runs_on_the_device(loaded, mode, rng):
    """Every expert in the VRAM cache: the batch's routing stays on the device (each (row, expert) pair a GEMV from
    its slot) and, in a graph mode, the whole step is a captured graph, one per member set. Over steps whose member
    sets change (graphs captured and replayed at new positions), every row is, bit for bit, its twin stepped in a
    batch of one, and the state goes on decoding as the twin's."""
    name, model = loaded
    g = model.info.geometry
    cache = whole_cache(model)
    prompts = [prompt_ids(model, rng, n) for n in (9, 23, 14, 31, 8)]
    together = cached_engines(model, cache, len(prompts), mode)
    apart = cached_engines(model, cache, len(prompts), mode)
    try:
        for prompt, a, b in zip(prompts, together, apart):
            fed(a, prompt)
            fed(b, prompt)
        for step in range(8):
            members = sorted(rng.choice(len(prompts), int(rng.integers(2, len(prompts) + 1)), replace=False))
            if step % 3 == 2:
                members = members[::-1]  # another order: the same step, its graph replayed
            ids = [int(t) for t in rng.integers(0, g.n_vocab, len(members))]
            params = [GREEDY if (step + i) % 2 else SAMPLED for i in range(len(members))]
            us = [float(u) for u in rng.random(len(members))]
            got = batch([together[i] for i in members], ids, params, us)
            want = [batch([apart[i]], [t], [p], [u])[0] for i, t, p, u in zip(members, ids, params, us)]
            assert got == want, (name, step, members, got, want)
            for i in members:
                logits = together[i].logits()
                assert np.all(np.isfinite(logits)), (name, step, i)
                assert_same_bits(logits, apart[i].logits(), f"{name} {mode} step {step} session {i}")
        for a, b in zip(together, apart):
            t = int(rng.integers(0, g.n_vocab))
            a.prefill([t], [0] * (a.position + 1))
            b.prefill([t], [0] * (b.position + 1))
            assert_same_bits(a.logits(), b.logits(), f"{name} {mode}: a step after the batches")
    finally:
        close(together, apart)


def test_a_captured_batch_is_the_uncaptured_one(loaded, rng):
    """The same batches in token-graph mode (one captured graph a member set) and uncaptured: the same bits; and
    both within the decode bounds of plain steps with the same cache."""
    name, model = loaded
    g = model.info.geometry
    cache = whole_cache(model)
    prompts = [prompt_ids(model, rng, n) for n in (12, 7, 20)]
    captured = cached_engines(model, cache, 3, Mode.TOKEN_GRAPH)
    launched = cached_engines(model, cache, 3, Mode.UNCAPTURED)
    stepped = [GpuEngine(open_native_session(model, context=CONTEXT, kv="bf16", cache=cache), rows_of(model))
               for _ in prompts]
    try:
        for prompt, a, b, c in zip(prompts, captured, launched, stepped):
            for e in (a, b, c):
                fed(e, prompt)
        errors = []
        for step in range(5):
            ids = [int(t) for t in rng.integers(0, g.n_vocab, 3)]
            assert batch(captured, ids) == batch(launched, ids), (name, step)
            for a, b, c, t in zip(captured, launched, stepped, ids):
                c.prefill([t], [0] * (c.position + 1))
                assert_same_bits(a.logits(), b.logits(), f"{name} step {step}: captured against uncaptured")
                errors.append(relative_errors([a.logits()], [c.logits()])[0])
        errors = np.array(errors)
        print(f"{name}: cached batch against plain steps, median {np.median(errors):.2e}, worst {errors.max():.2e}")
        assert np.median(errors) < bounds(name, "bf16") and errors.max() < GARBAGE, (name, errors)
    finally:
        close(captured, launched, stepped)


def test_the_same_members_in_any_order_are_one_step_and_one_graph(loaded, rng):
    """A server gathers a batch in the order its members' steps arrive. The members go in the order their sessions
    were made and the first of them leads: every order of the same members gives the same bits and replays one
    captured graph, counted on the first-made session."""
    name, model = loaded
    g = model.info.geometry
    cache = whole_cache(model)
    prompts = [prompt_ids(model, rng, n) for n in (10, 17, 8, 13)]
    ordered = cached_engines(model, cache, len(prompts), Mode.TOKEN_GRAPH)
    shuffled = cached_engines(model, cache, len(prompts), Mode.TOKEN_GRAPH)
    try:
        for prompt, a, b in zip(prompts, ordered, shuffled):
            fed(a, prompt)
            fed(b, prompt)
        before = [e.stats()["batch_graphs"] for e in shuffled]
        for step in range(6):
            ids = [int(t) for t in rng.integers(0, g.n_vocab, len(prompts))]
            order = [int(i) for i in rng.permutation(len(prompts))]
            got = batch([shuffled[i] for i in order], [ids[i] for i in order])
            want = batch(ordered, ids)
            assert [got[order.index(i)] for i in range(len(prompts))] == want, (name, step, order)
            for a, b in zip(ordered, shuffled):
                assert_same_bits(b.logits(), a.logits(), f"{name} step {step} order {order}")
        graphs = [e.stats()["batch_graphs"] - n for e, n in zip(shuffled, before)]
        assert graphs == [1, 0, 0, 0], (name, graphs)
        assert shuffled[0].stats()["batch_steps"] == 6 and shuffled[1].stats()["batch_steps"] == 0
    finally:
        close(ordered, shuffled)


def test_a_runner_keeps_the_step_graphs_it_launched_last(loaded, rng):
    """Past 64 captured steps a new one replaces the one launched longest ago: a server's member sets come and go,
    and dropping every graph would capture the live ones again. Five sessions, every member set with the first
    (which leads) and every choice of sampler: 162 keys, each captured once; the last 64 replay, the first was
    replaced."""
    import itertools

    name, model = loaded
    g = model.info.geometry
    cache = whole_cache(model)
    engines = cached_engines(model, cache, 5, Mode.TOKEN_GRAPH)
    try:
        for e in engines:
            fed(e, prompt_ids(model, rng, 9))  # qwen4exp's prompts put the n-gram EOS at ids 5 and 6
        keys = [((0, *others), samplers) for n in range(5) for others in itertools.combinations(range(1, 5), n)
                for samplers in itertools.product((GREEDY, SAMPLED), repeat=n + 1)]
        assert len(keys) == 162

        def graphs_after(members, samplers):
            ids = [int(t) for t in rng.integers(0, g.n_vocab, len(members))]
            batch([engines[i] for i in members], ids, list(samplers), [0.5] * len(members))
            return engines[0].stats()["batch_graphs"]

        for key in keys:
            graphs_after(*key)
        assert engines[0].stats()["batch_graphs"] == 162, name
        assert graphs_after(*keys[-1]) == 162 and graphs_after(*keys[-64]) == 162, (name, "the last 64 replay")
        assert graphs_after(*keys[0]) == 163, (name, "the first, replaced, is captured again")
    finally:
        close(engines)


def moe_rings(stats_before, stats_after) -> tuple[int, int, int]:
    """Rings, expert hits and misses between two stats of one session."""
    return (stats_after["rings"] - stats_before["rings"],
            sum(stats_after["expert_hits"]) - sum(stats_before["expert_hits"]),
            sum(stats_after["expert_misses"]) - sum(stats_before["expert_misses"]))


@pytest.mark.parametrize("placement", ["half cached", "on the pool"])
def test_a_batch_whose_experts_the_cache_lacks_rings_once_a_layer(loaded, placement, rng):
    """The routed experts the VRAM cache lacks go to the CPU pool through the step's doorbell: one ring a MoE layer
    for all the rows (each expert of their union computed once, ExpertPool.run_rows_sum), as many rings as a plain
    token's, every routed pair a hit or a miss; nothing in the stream waits on the host, so the step is captured
    (token-graph and layer-graph sessions alike: the same bits), and every row is its twin's in a batch of one. An
    uncaptured step rings nothing (its experts grouped by the host: its launches, queued ahead of an answer, could
    fill the launch queue). All stay within the decode bounds of plain steps in the same placement."""
    name, model = loaded
    g = model.info.geometry
    cache = half_cache(model) if placement == "half cached" else None
    staged = staging(model)
    prompts = [prompt_ids(model, rng, n) for n in (12, 7, 20)]
    captured = [engine(model, staged, cache=cache, mode=Mode.TOKEN_GRAPH) for _ in prompts]
    launched = [engine(model, staged, cache=cache, mode=Mode.LAYER_GRAPHS) for _ in prompts]
    grouped = [engine(model, staged, cache=cache, mode=Mode.UNCAPTURED) for _ in prompts]
    twins = [engine(model, staged, cache=cache, mode=Mode.TOKEN_GRAPH) for _ in prompts]
    stepped = [GpuEngine(open_native_session(model, context=CONTEXT, kv="bf16", cache=cache), rows_of(model))
               for _ in range(len(prompts) + 1)]  # the last one counts a plain token's rings
    try:
        for prompt, *group in zip(prompts, captured, launched, grouped, twins, stepped):
            for e in group:
                fed(e, prompt)
        probe = stepped.pop()
        fed(probe, prompts[0])
        before = probe.native.stats()
        probe.prefill([1], [0] * (probe.position + 1))
        token_rings = moe_rings(before, probe.native.stats())[0]
        probe.close()
        assert token_rings > 0, name
        errors = []
        for step in range(4):
            ids = [int(t) for t in rng.integers(0, g.n_vocab, 3)]
            before = captured[0].native.stats()
            got = batch(captured, ids)
            rings, hits, misses = moe_rings(before, captured[0].native.stats())
            assert rings == token_rings and hits + misses == 3 * g.n_expert_used * rings, (name, rings, hits, misses)
            assert (hits > 0) == (placement == "half cached"), (name, hits)
            assert got == batch(launched, ids) == [alone(e, t) for e, t in zip(twins, ids)], (name, step)
            before = grouped[0].native.stats()
            batch(grouped, ids)
            assert moe_rings(before, grouped[0].native.stats())[0] == 0, name
            for a, b, twin, d, c, t in zip(captured, launched, twins, grouped, stepped, ids):
                c.prefill([t], [0] * (c.position + 1))
                assert np.all(np.isfinite(a.logits())), (name, step)
                assert_same_bits(a.logits(), b.logits(), f"{name} {placement} step {step}: token, layer graphs")
                assert_same_bits(a.logits(), twin.logits(), f"{name} {placement} step {step}: a batch of one")
                errors += relative_errors([a.logits(), d.logits()], [c.logits(), c.logits()]).tolist()
        errors = np.array(errors)
        print(f"{name} {placement}: batch against plain steps, median {np.median(errors):.2e}, worst "
              f"{errors.max():.2e}")
        assert np.median(errors) < bounds(name, "bf16") and errors.max() < GARBAGE, (name, errors)
    finally:
        close(captured, launched, grouped, twins, stepped)


class _Noted(GpuEngine):
    """A GpuEngine that notes every call that moves its state and what it returned, in order: what the Batcher made
    of a session's calls (prompt pieces, lone steps, rows of batched steps), for a replay alone (replayed)."""

    notes: list

    def feed(self, ids, params, u, seen):
        token = super().feed(ids, params, u, seen)
        self.notes.append(("feed", list(ids), params, u, list(seen), token))
        return token

    def prefill(self, ids, seen):
        super().prefill(ids, seen)
        self.notes.append(("prefill", list(ids), None, 0.0, list(seen), None))

    @staticmethod
    def step_batch(engines, ids, params, us, seens):
        tokens = GpuEngine.step_batch(engines, ids, params, us, seens)
        for e, t, p, u, seen, token in zip(engines, ids, params, us, seens, tokens):
            e.notes.append(("row", [t], p, u, list(seen), token))
        return tokens


def replayed(model, notes):
    """What the noted calls return on a session of their own, a row as a step of one row (its bits in any step)."""
    session = model.session(CONTEXT, kv="bf16", prompt_cpu=False)
    try:
        e, out = session.engine, []
        for kind, ids, params, u, seen, _ in notes:
            if kind == "prefill":
                e.prefill(ids, seen)
                out.append(None)
            elif kind == "feed":
                out.append(e.feed(ids, params, u, seen))
            else:
                out.append(GpuEngine.step_batch([e], ids, [params], [u], [seen])[0])
        return out
    finally:
        session.close()


def test_sessions_through_the_batcher_decode_together_as_alone(loaded, rng):
    """Model sessions driven by concurrent threads through a Batcher (the server's way), their decode steps
    batched (the policy told batches are cheap): each session's calls, as the Batcher made them (prompt pieces, lone
    steps, rows of batched steps), give the same tokens when the session makes them alone, every one."""
    from concurrent.futures import ThreadPoolExecutor

    from strata.generation.batcher import Batcher

    name, model = loaded
    prompts = [prompt_ids(model, rng, n) for n in (8, 17, 11)]
    sessions = [model.session(CONTEXT, kv="bf16", prompt_cpu=False) for _ in prompts]
    engines = [s.engine for s in sessions]
    for e in engines:
        e.__class__, e.notes = _Noted, []
    try:
        with Batcher() as batcher:
            key = (_Noted, engines[0].batch_key)
            batcher.policy.record(key, 1, 1.0)  # a lone step "costs" more than any batch: always batch
            for s in sessions:
                s.engine = batcher.member(s.engine)

            def run(i):
                with sessions[i].engine.active():
                    return list(sessions[i].complete(prompts[i], max_tokens=12, temperature=0).tokens)

            with ThreadPoolExecutor(len(prompts)) as pool:
                got = list(pool.map(run, range(len(prompts))))
            stats = batcher.stats()
    finally:
        for s, e in zip(sessions, engines):
            s.engine = e
            s.close()
    for i, e in enumerate(engines):
        returned = [note[-1] for note in e.notes]
        drawn = [t for t in returned if t is not None]
        assert drawn[:len(got[i])] == got[i], (name, i, "the noted calls are not the completion's", drawn, got[i])
        assert replayed(model, e.notes) == returned, (name, i, [note[0] for note in e.notes])
    assert any(note[0] == "row" for e in engines for note in e.notes), "no step ran in a batch"
    assert stats["decode_rows"] > stats["decode_batches"], stats  # some steps ran together
