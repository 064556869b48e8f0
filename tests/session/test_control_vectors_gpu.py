"""Control vectors on the GPU (docs/control_vectors.md): a session's vectors are added to every residual stream
after each steered layer's last write, in decode (all three modes), prompt chunks, verification rows and batched
steps, for all three architectures, within the decode bounds of the numpy reference steered alike; a zero vector
leaves every logit's bits as none does; vectors change between turns (new values into the same table, or other
layers, which recaptures the graphs once); sessions with different vectors step together, each row what it gives
alone; and the layer states `strata cvector` measures on the GPU give the reference's vector."""

import numpy as np
import pytest

from strata import _native
from strata.control_vectors import make_control_vector
from strata.control_vectors.make import last_token_states
from strata.options import Mode
from strata.reference import Reference
from strata.runtime.engine import GpuEngine
from strata.runtime.steering import ControlVectors

from support.compare import assert_same_bits, relative_errors
from support.native_session import GREEDY, open_native_session, whole_cache
from test_decode_session import GARBAGE, MEDIAN, STEADY, decode
from test_prompt_path import bounds, loaded, prompt_ids, rows_of, staging  # noqa: F401 (loaded: a fixture)

pytestmark = pytest.mark.gpu

CONTEXT = 256
# A vector's values over the tiny models' stream RMS (about 1): the reference's logits move by 0.3..0.5 of their
# scale with vectors on layers 1 and 3 (measured on seeds 0..2 of every architecture), far above any bound here.
SCALE = 0.3
WINDOW = 5  # a verification's rows


def odd_layers(model) -> list[int]:
    return list(range(1, model.info.geometry.n_layer, 2))


def low_layers(model) -> list[int]:
    return list(range(model.info.geometry.n_layer - 1))


def table(model, rng, layers, scale=SCALE) -> dict[int, np.ndarray]:
    g = model.info.geometry
    return {layer: (rng.standard_normal(g.n_embd) * scale).astype(np.float32) for layer in layers}


def zeros(model, layers) -> dict[int, np.ndarray]:
    return {layer: np.zeros(model.info.geometry.n_embd, np.float32) for layer in layers}


def steer(native, model, vectors) -> None:
    native.set_control_vectors(*ControlVectors(model.info.geometry).staged(vectors or {}))


def stepping(model, mode=Mode.UNCAPTURED, kv="bf16", vectors=None):
    """A native session without a prompt path (every token a decode step), steered by `vectors`."""
    native = open_native_session(model, context=CONTEXT, kv=kv, mode=mode)
    steer(native, model, vectors)
    return native


def engine(model, vectors=None, *, mode=Mode.TOKEN_GRAPH, chunk=8, staged=None, **options) -> GpuEngine:
    """A GPU engine with a prompt path (the pool's share off: a token's experts on one side in every chunk)."""
    native = open_native_session(model, context=CONTEXT, kv="bf16", mode=mode, prompt_chunk=chunk,
                                 staging=staged if staged is not None else staging(model), prompt_cpu=False,
                                 **options)
    e = GpuEngine(native, rows_of(model), control_vectors=ControlVectors(model.info.geometry))
    e.set_steering(vectors or {})
    return e


def fed(e, ids):
    e.prefill(ids, [0] * (e.position + len(ids)))


def stepped(e, ids):
    out = []
    for t in ids:
        e.prefill([t], [0] * (e.position + 1))
        out.append(e.logits())
    return np.array(out)


def reference(model, vectors=None) -> Reference:
    return Reference(model.file, activation_quant=True, control_vectors=vectors)


def check_close(name, what, errors, median):
    print(f"{name} {what}: median {np.median(errors):.2e}, worst {np.max(errors):.2e}")
    assert np.all(np.isfinite(errors)), (name, what)
    assert np.median(errors) < median, (name, what, errors)
    assert np.quantile(errors, 0.9) < STEADY and np.max(errors) < GARBAGE, (name, what, errors)


# --- decode ---

@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_decode_with_vectors_matches_the_reference_steered_alike(loaded, kv, rng):
    name, model = loaded
    g = model.info.geometry
    vectors = table(model, rng, odd_layers(model))
    native = stepping(model, kv=kv, vectors=vectors)
    assert native.control_vector_layers == sorted(vectors)
    prompt = rng.integers(0, g.n_vocab, 8)
    steered = reference(model, vectors)
    tokens, gpu, ref = decode(native, model, prompt, 40, steered)
    dense = "quant" if name.endswith("quant") else "float"
    check_close(name, f"kv={kv}, steered decode vs the steered reference", relative_errors(gpu, ref), MEDIAN[dense, kv])
    # the vectors are applied: the plain reference is far from the steered one at every prompt position
    moved = relative_errors(reference(model).forward(prompt), ref[:len(prompt)])
    assert np.median(moved) > 5 * MEDIAN[dense, kv], (name, moved)


def test_every_mode_gives_the_same_logits_with_vectors_and_a_zero_vector_those_of_none(loaded, rng):
    name, model = loaded
    prompt = rng.integers(0, model.info.geometry.n_vocab, 6)
    vectors = table(model, rng, odd_layers(model))
    runs = {}
    for mode in Mode:
        for which, steering in (("none", None), ("zero", zeros(model, odd_layers(model))), ("steered", vectors)):
            native = stepping(model, mode, vectors=steering)
            runs[mode, which] = decode(native, model, prompt, 14)[:2]
            if mode is not Mode.UNCAPTURED:
                assert native.captured, (name, mode, which)
            native.close()
    for mode in Mode:
        assert runs[mode, "zero"][0] == runs[mode, "none"][0], (name, mode)
        assert_same_bits(runs[mode, "zero"][1], runs[mode, "none"][1], f"{name} {mode}: a zero vector vs none")
        assert runs[mode, "steered"][0] == runs[Mode.UNCAPTURED, "steered"][0], (name, mode)
        assert_same_bits(runs[mode, "steered"][1], runs[Mode.UNCAPTURED, "steered"][1],
                         f"{name} {mode}: steered vs steered uncaptured")
    assert not np.array_equal(runs[Mode.UNCAPTURED, "steered"][1], runs[Mode.UNCAPTURED, "none"][1]), name


@pytest.mark.parametrize("mode", [Mode.LAYER_GRAPHS, Mode.TOKEN_GRAPH])
def test_vectors_change_between_turns_in_the_captured_modes_as_uncaptured(loaded, mode, rng):
    """Turn 1 with vectors A, turn 2 with other values on A's layers (a copy into the table the graphs read: they
    stay captured), turn 3 with vectors on other layers (the graphs are captured again), turn 4 with none: the
    captured session's logits are the uncaptured one's, bit for bit, and both the reference's switched alike."""
    name, model = loaded
    g = model.info.geometry
    a = table(model, rng, odd_layers(model))
    turns = [a, table(model, rng, odd_layers(model)), table(model, rng, low_layers(model)), {}]
    ids = [[int(t) for t in rng.integers(0, g.n_vocab, 5)] for _ in turns]
    captured, plain = stepping(model, mode), stepping(model)
    steered = reference(model)
    ple_c, ple_p = rows_of(model), rows_of(model)
    got, want, ref = [], [], []
    for turn, (vectors, turn_ids) in enumerate(zip(turns, ids)):
        for native in (captured, plain):
            steer(native, model, vectors)
        steered.set_control_vectors(vectors)
        if turn == 1:
            assert captured.captured, "new values on the same layers keep the graphs"
        assert captured.control_vector_layers == sorted(vectors)
        for t in turn_ids:
            captured.step(t, ple_c.rows(t) if ple_c else None, GREEDY, 0.0, sample=False)
            plain.step(t, ple_p.rows(t) if ple_p else None, GREEDY, 0.0, sample=False)
            got.append(captured.logits())
            want.append(plain.logits())
        ref.extend(steered.forward(turn_ids))
    assert_same_bits(np.array(got), np.array(want), f"{name} {mode}: captured vs uncaptured across the turns")
    dense = "quant" if name.endswith("quant") else "float"
    check_close(name, f"{mode} turns vs the reference", relative_errors(want, ref), MEDIAN[dense, "bf16"])


# --- prompt chunks ---

def test_a_prompt_with_vectors_matches_the_reference_and_decodes_on(loaded, rng):
    name, model = loaded
    g = model.info.geometry
    vectors = table(model, rng, odd_layers(model))
    prompt = prompt_ids(model, rng, 40)
    chunked = engine(model, vectors, chunk=16)
    step_by_step = stepping(model, vectors=vectors)
    try:
        every = chunked.score(prompt, prompt)  # the prompt path's every position
        want = reference(model, vectors).forward(prompt)
        error = relative_errors([chunked.logits()], [want[-1]])[0]
        print(f"{name}: steered prompt path vs the steered reference at the last token {error:.2e}")
        assert error < max(4 * bounds(name, "bf16"), 0.05), (name, error)
        check_close(name, "every position vs the reference", relative_errors(list(every), list(want)),
                    max(4 * bounds(name, "bf16"), 0.05))
        # the state the prompt left decodes on as stepping the prompt does, the vectors still on
        ple = rows_of(model)
        for t in prompt:
            step_by_step.step(t, ple.rows(t) if ple else None, GREEDY, 0.0, sample=False)
        then = [int(t) for t in rng.integers(0, g.n_vocab, 10)]
        after_chunked = stepped(chunked, then)
        after_stepped = []
        for t in then:
            step_by_step.step(t, ple.rows(t) if ple else None, GREEDY, 0.0, sample=False)
            after_stepped.append(step_by_step.logits())
        check_close(name, "decoding after the steered prompt", relative_errors(after_chunked, after_stepped),
                    bounds(name, "bf16"))
    finally:
        chunked.close()
        step_by_step.close()


def test_a_zero_vector_leaves_the_prompt_paths_logits(loaded, rng):
    name, model = loaded
    g = model.info.geometry
    prompt = prompt_ids(model, rng, 30)
    logits = {}
    for which, vectors in (("none", None), ("zero", zeros(model, range(g.n_layer)))):
        e = engine(model, vectors, chunk=8)
        try:
            every = e.score(prompt, prompt)
            logits[which] = (every, e.logits())
        finally:
            e.close()
    assert_same_bits(logits["zero"][0], logits["none"][0], f"{name}: every position, a zero vector vs none")
    assert_same_bits(logits["zero"][1], logits["none"][1], f"{name}: the last logits, a zero vector vs none")


# --- verification rows ---

def test_verification_rows_carry_the_vectors(loaded, rng):
    """A verification is a step of one span (the RowsTable's per-row vectors): its rows within the bounds of the
    prompt path's steered logits and of the steered reference; a zero vector's rows are none's, bit for bit."""
    name, model = loaded
    g = model.info.geometry
    vectors = table(model, rng, odd_layers(model))
    prompt = prompt_ids(model, rng, 12)
    window = [int(t) for t in rng.integers(0, g.n_vocab, WINDOW)]
    verifying, scoring = engine(model, vectors, verify_rows=WINDOW), engine(model, vectors)
    none, zero = engine(model, verify_rows=WINDOW), engine(model, zeros(model, odd_layers(model)), verify_rows=WINDOW)
    try:
        for e in (verifying, scoring, none, zero):
            fed(e, prompt)
        rows = verifying.verify(window, [0] * (verifying.position + WINDOW))
        scored = scoring.score(window, [0] * (scoring.position + WINDOW))
        check_close(name, "steered verify rows vs the steered prompt path", relative_errors(list(rows), list(scored)),
                    bounds(name, "bf16"))
        want = reference(model, vectors).forward(prompt + window)[-WINDOW:]
        check_close(name, "steered verify rows vs the steered reference", relative_errors(list(rows), list(want)),
                    max(4 * bounds(name, "bf16"), 0.05))
        assert_same_bits(zero.verify(window, [0] * (zero.position + WINDOW)),
                         none.verify(window, [0] * (none.position + WINDOW)), f"{name}: verify, a zero vector vs none")
        # a cut keeps the steered state: decoding on from it is the kept tokens' own
        verifying.truncate(len(prompt) + 2)
        kept = engine(model, vectors, verify_rows=WINDOW)
        try:
            fed(kept, prompt)
            kept.verify(window[:2], [0] * (kept.position + 2))
            then = [int(t) for t in rng.integers(0, g.n_vocab, 4)]
            assert_same_bits(stepped(verifying, then), stepped(kept, then), f"{name}: decoding after a steered cut")
        finally:
            kept.close()
    finally:
        for e in (verifying, scoring, none, zero):
            e.close()


# --- batched steps ---

def batch(engines, ids):
    rows = [e.ple.rows(t) if e.ple is not None else None for e, t in zip(engines, ids)]
    n = len(engines)
    return _native.step_batch([e.native for e in engines], ids, rows if rows[0] is not None else None, [GREEDY] * n,
                              [0.0] * n)


@pytest.mark.parametrize("mode", list(Mode))
@pytest.mark.parametrize("experts", ["staged", "cached"])
def test_sessions_with_different_vectors_step_together_each_as_alone(loaded, mode, experts, rng):
    """None, vectors A, vectors B on other layers and a zero vector, batched: each row is its session stepped in a
    batch of one, bit for bit (the zero one's is none's); then A's session takes other layers and B's none between
    two batches (another captured step where every expert is cached), and the rows still are."""
    name, model = loaded
    g = model.info.geometry
    a, b = table(model, rng, odd_layers(model)), table(model, rng, low_layers(model))
    plan = [None, a, b, zeros(model, odd_layers(model))]
    options = {"cache": whole_cache(model)} if experts == "cached" else {}
    together_staging, alone_staging = staging(model), staging(model)
    together = [engine(model, v, mode=mode, chunk=16, staged=together_staging, **options) for v in plan]
    apart = [engine(model, v, mode=mode, chunk=16, staged=alone_staging, **options) for v in plan]
    try:
        prompts = [prompt_ids(model, rng, n) for n in (9, 14, 11, 9)]
        prompts[3] = list(prompts[0])  # the zero vector's session beside none's, from the same prompt
        for p, x, y in zip(prompts, together, apart):
            fed(x, p)
            fed(y, p)
        for step in range(4):
            if step == 2:  # A's session moves to other layers, B's to none: other kernels' arguments
                for group in (together, apart):
                    group[1].set_steering(table(model, np.random.default_rng(step), low_layers(model)))
                    group[2].set_steering({})
            ids = [int(t) for t in rng.integers(0, g.n_vocab, 4)]
            ids[3] = ids[0]
            got = batch(together, ids)
            want = [batch([e], [t])[0] for e, t in zip(apart, ids)]
            assert got == want, (name, mode, step, got, want)
            for i, (x, y) in enumerate(zip(together, apart)):
                assert_same_bits(x.logits(), y.logits(), f"{name} {mode} {experts} step {step} row {i}")
            assert_same_bits(together[3].logits(), together[0].logits(), f"{name} step {step}: zero vs none")
    finally:
        for e in together + apart:
            e.close()


def test_a_batched_row_with_vectors_matches_the_reference(loaded, rng):
    name, model = loaded
    g = model.info.geometry
    plan = [table(model, rng, odd_layers(model)), None, table(model, rng, low_layers(model))]
    staged = staging(model)  # sessions of one step share a staging
    engines = [engine(model, v, chunk=16, staged=staged) for v in plan]
    try:
        prompts = [prompt_ids(model, rng, n) for n in (10, 13, 9)]
        for e, p in zip(engines, prompts):
            fed(e, p)
        got, want = [], []
        for _ in range(3):
            ids = [int(t) for t in rng.integers(0, g.n_vocab, 3)]
            batch(engines, ids)
            got.extend(e.logits() for e in engines)
            for i, t in enumerate(ids):
                prompts[i].append(t)
            want.extend(reference(model, v).forward(p)[-1] for v, p in zip(plan, prompts))
        check_close(name, "steered batch rows vs the steered reference", relative_errors(got, want),
                    max(4 * bounds(name, "bf16"), 0.05))
    finally:
        for e in engines:
            e.close()


# --- strata cvector's layer states ---

def random_prompts(model, rng, count):
    tokenizer, g = model.tokenizer, model.info.geometry
    texts = (tokenizer.decode(rng.integers(0, g.n_vocab, 8).tolist()) for _ in range(count))
    return [" ".join(text.split()) or "x" for text in texts]


def test_a_vector_made_from_the_gpus_states_is_the_references(loaded, rng):
    name, model = loaded
    tokenizer = model.tokenizer
    pairs = list(zip(random_prompts(model, rng, 4), random_prompts(model, rng, 4)))
    e = engine(model, chunk=16)
    try:
        plain = reference(model)
        errors = []
        for positive, _ in pairs:
            ids = tokenizer.encode(positive, special=True)
            got = e.layer_states(ids)
            assert got.shape == (model.info.geometry.n_layer, model.info.geometry.n_embd) and e.position == len(ids)
            want = last_token_states(plain, ids)
            errors.extend(relative_errors(list(got), list(want)))
        check_close(name, "layer states vs the reference's", np.array(errors), 4 * bounds(name, "bf16"))
        for method in ("mean", "pca"):
            gpu = make_control_vector(e.layer_states, tokenizer, pairs, method)
            ref = make_control_vector(reference(model), tokenizer, pairs, method)
            assert sorted(gpu) == sorted(ref) == list(range(1, model.info.geometry.n_layer))
            errors = relative_errors([gpu[layer] for layer in sorted(gpu)], [ref[layer] for layer in sorted(ref)])
            check_close(name, f"{method} direction vs the reference's", errors, 4 * bounds(name, "bf16"))
    finally:
        e.close()


def test_layer_states_record_the_vectors_in_them(loaded, rng):
    """The states are the streams after each layer's last write, its vector in them: the steered reference's."""
    name, model = loaded
    vectors = table(model, rng, odd_layers(model))
    e = engine(model, vectors, chunk=8)
    try:
        ids = prompt_ids(model, rng, 19)  # three chunks: the last token is the last chunk's
        got = e.layer_states(ids)
        want = last_token_states(reference(model, vectors), ids)
        check_close(name, "steered layer states vs the steered reference", relative_errors(list(got), list(want)),
                    4 * bounds(name, "bf16"))
    finally:
        e.close()
