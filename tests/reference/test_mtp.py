"""The reference's MTP block (strata.reference.mtp) on tiny synthesized files with a block, for every architecture:
against an independent torch implementation of the equations (support.mtp_torch), its chained drafts against the
block run step by step, its caches through a prompt fed at once, token by token and through drafted sessions;
errors for a missing or malformed block. qwen4exp's runs long enough that its QSA indexer leaves tokens out (the
tiny budget is 8 tokens)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import strata
from strata.format import ModelFile
from strata.generation import Session
from strata.generation.draft_length import FixedDraftLength
from strata.reference import Reference
from strata.reference.engine import ReferenceEngine
from strata.reference.mtp import MtpBlock, MtpCache, MtpDrafter, MtpReference
from strata.reference.weights import Weights
from strata.synth import synthesize
from support.compare import relative_error
from support.mtp_torch import TorchHcMtp, TorchMtp

ARCHS = ("qwen4exp", "qwen3next", "qwen35moe")
# The reference rounds activations to float32 (about 1e-7 seen); the torch oracles are float64. Routing (the MoE's
# top-k, QSA's top blocks) is discrete: a near-tie within that rounding could pick differently, at odds of about
# 1e-6 a choice; exact ties (blocks no indexer head scores above 0) go to the lower index in both.
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """arch -> (file with an MTP block, the same seed's file without it)."""
    root = tmp_path_factory.mktemp("mtp")
    return {arch: (synthesize(root / f"{arch}-mtp.gguf", arch, seed=11, mtp=True),
                   synthesize(root / f"{arch}.gguf", arch, seed=11)) for arch in ARCHS}


def _torch_block(reference: Reference) -> TorchMtp | TorchHcMtp:
    g, w = reference.geometry, reference.weights
    shape = dict(layer=g.n_layer, n_head=g.n_head, n_head_kv=g.n_head_kv, head_dim=g.head_dim, rope_dim=g.rope_dim,
                 rope_theta=g.rope_theta, eps=g.rms_eps, top_k=g.n_expert_used)
    if not g.has_hyper_connections:
        return TorchMtp(w.get, w.has, **shape)
    indexer = (g.indexer_n_heads, g.indexer_head_dim, g.qsa_ratio(g.n_layer), g.indexer_top_k)
    return TorchHcMtp(w.get, w.has, hc=g.hc_count, indexer=indexer, **shape)


def _rows(arch: str) -> tuple[int, ...]:
    """Rows per call of the oracle test: qwen4exp's run past its QSA budget (8 tokens; 2 blocks + the tail)."""
    return (4, 1, 3, 9) if arch == "qwen4exp" else (4, 1, 3)


def _prompt(rng: np.random.Generator, vocab: int, n: int) -> list[int]:
    return rng.integers(0, vocab, n).tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_block_against_an_independent_torch_implementation(files, arch):
    rng = np.random.default_rng()
    with ModelFile(files[arch][0]) as f:
        reference = Reference(f)
        g = reference.geometry
        block, oracle = MtpBlock(g, reference.weights), _torch_block(reference)
        cache = block.new_cache()
        for rows in _rows(arch):  # rows in one call, then more after them in the same cache
            hidden = rng.standard_normal((rows, block.width)).astype(np.float32)
            ids = rng.integers(0, g.n_vocab, rows)
            logits, out = block.forward(cache, hidden, ids)
            want = [oracle.step(hidden[j], int(ids[j])) for j in range(rows)]
            assert np.all(np.isfinite(logits)) and np.all(np.isfinite(out))
            assert relative_error(logits, np.stack([w[0].numpy() for w in want])) < TOLERANCE
            assert relative_error(out, np.stack([w[1].numpy() for w in want])) < TOLERANCE


@pytest.mark.parametrize("arch", ARCHS)
def test_drafts_chain_the_block_step_by_step_and_match_torch(files, arch):
    rng = np.random.default_rng()
    with ModelFile(files[arch][0]) as f:
        mtp = MtpReference(Reference(f))
        g = mtp.geometry
        prompt, token = _prompt(rng, g.n_vocab, 12), int(rng.integers(0, g.n_vocab))
        mtp.forward(prompt)
        hidden = mtp.block.state_of(mtp.main)
        before = copy.deepcopy(mtp.state)
        drafts = MtpDrafter(mtp).propose(prompt + [token], 4)
        assert len(drafts) == 4
        # the block's caches are left as they were
        _assert_same_cache(mtp.state[1], before[1])
        assert np.array_equal(mtp.state[2], before[2])

        cache, h, t, stepped = copy.deepcopy(mtp.state[1]), mtp.state[2][None], token, []
        oracle = _torch_block(mtp.main)
        for j in range(len(prompt) - 1):  # the oracle's cache: the prompt's pairs (h_j, t_{j+1})
            oracle.step(hidden[j], prompt[j + 1])
        h_oracle = hidden[-1]
        for _ in range(4):
            logits, h = mtp.block.forward(cache, h, [t])
            want_logits, want_h = oracle.step(h_oracle, t)
            assert relative_error(logits[0], want_logits.numpy()) < TOLERANCE
            t, h_oracle = int(np.argmax(logits[0])), want_h.numpy()
            stepped.append(t)
        assert drafts == stepped


@pytest.mark.parametrize("arch", ARCHS)
def test_a_prompt_fed_at_once_leaves_the_cache_of_one_fed_token_by_token(files, arch):
    rng = np.random.default_rng()
    with ModelFile(files[arch][0]) as f:
        prompt = _prompt(rng, f.geometry.n_vocab, 14)
        at_once, by_token = MtpReference(Reference(f)), MtpReference(Reference(f))
        at_once.forward(prompt[:5])
        at_once.forward(prompt[5:])
        for token in prompt:
            by_token.forward([token])
        assert at_once.state[1].rows == len(prompt) - 1
        _assert_close_cache(at_once.state[1], by_token.state[1])
        assert relative_error(at_once.state[2], by_token.state[2]) < TOLERANCE


@pytest.mark.parametrize("arch", ARCHS)
def test_mtp_drafted_greedy_output_is_stepping_output(files, arch, rng):
    """Drafts of every step checked (a fixed length) and the adaptive policy through ReferenceModel.session: the
    tokens are stepping's, and the block's cache afterwards is the one of the final sequence fed token by token.
    EOS ignored: an answer that ends on its first token drafts nothing (it did on one seed)."""
    with strata.load(files[arch][0], engine="reference") as model:
        prompt = _prompt(rng, model.file.geometry.n_vocab, 5)
        want = model.session().complete(prompt, max_tokens=12, temperature=0, ignore_eos=True).tokens
        adaptive = model.session(draft="mtp", draft_tokens=3)
        assert adaptive.complete(prompt, max_tokens=12, temperature=0, ignore_eos=True).tokens == want
        # prefix reuse: the second call restores a snapshot of the first (the block's cache with it)
        longer = prompt + list(want[:4]) + _prompt(rng, model.file.geometry.n_vocab, 2)
        again = adaptive.complete(longer, max_tokens=6, temperature=0)
        assert again.usage.cached_tokens > 0
        assert again.tokens == model.session().complete(longer, max_tokens=6, temperature=0).tokens
        _assert_in_step(adaptive.engine.reference, adaptive.tokens[:-1], model.file)
        for k in (1, 3):
            mtp = MtpReference(Reference(model.file))
            session = Session(ReferenceEngine(mtp, verify_rows=k + 1), model.tokenizer, MtpDrafter(mtp), k,
                              draft_length=FixedDraftLength(k))
            assert session.complete(prompt, max_tokens=12, temperature=0, ignore_eos=True).tokens == want
            assert session.stats.drafted > 0
            _assert_in_step(mtp, session.tokens[:-1], model.file)


def _assert_in_step(mtp: MtpReference, fed: list[int], file) -> None:
    """The block's caches and last input state are those of `fed` fed token by token."""
    replay = MtpReference(Reference(file))
    for token in fed:
        replay.forward([token])
    (_, cache, hidden), (_, want_cache, want_hidden) = mtp.state, replay.state
    assert mtp.n_past == len(fed)
    _assert_close_cache(cache, want_cache)
    assert relative_error(hidden, want_hidden) < TOLERANCE


def _cache_arrays(cache: MtpCache) -> list[np.ndarray]:
    return [cache.kv.k, cache.kv.v] + ([cache.indexer.raw_keys] if cache.indexer is not None else [])


def _assert_close_cache(got: MtpCache, want: MtpCache) -> None:
    assert (got.indexer is None) == (want.indexer is None)
    for a, b in zip(_cache_arrays(got), _cache_arrays(want)):
        assert a.shape == b.shape and relative_error(a, b) < TOLERANCE


def _assert_same_cache(got: MtpCache, want: MtpCache) -> None:
    assert (got.indexer is None) == (want.indexer is None)
    assert all(np.array_equal(a, b) for a, b in zip(_cache_arrays(got), _cache_arrays(want)))


@pytest.mark.parametrize("arch", ARCHS)
def test_a_verify_cut_back_to_any_row_leaves_the_block_as_stepping_there(files, arch):
    rng = np.random.default_rng()
    with ModelFile(files[arch][0]) as f:
        prompt, window = _prompt(rng, f.geometry.n_vocab, 4), _prompt(rng, f.geometry.n_vocab, 4)
        mtp = MtpReference(Reference(f))
        engine = ReferenceEngine(mtp, verify_rows=len(window))
        engine.prefill(prompt, prompt)
        engine.snapshot(0)
        for kept in range(len(window), 0, -1):
            engine.restore(0)
            engine.verify(window, prompt + window)
            engine.truncate(len(prompt) + kept)
            _assert_in_step(mtp, prompt + window[:kept], f)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_file_with_a_block_runs_its_main_model_as_the_same_seeds_file_without(files, arch):
    rng = np.random.default_rng()
    with ModelFile(files[arch][0]) as with_block, ModelFile(files[arch][1]) as without:
        assert with_block.geometry.n_mtp == 1 and without.geometry.n_mtp == 0
        assert with_block.metadata[f"{arch}.block_count"] == without.geometry.n_layer + 1
        prompt = _prompt(rng, without.geometry.n_vocab, 6)
        assert np.array_equal(Reference(with_block).forward(prompt), Reference(without).forward(prompt))


@pytest.mark.parametrize("arch", ARCHS)
def test_strata_synth_mtp_then_info_then_drafted_greedy_run(arch, tmp_path, capsys):
    """The command line end to end: `strata synth --mtp` writes a file that loads with no warning, `strata info`
    names its block, and the reference drafts from it (ReferenceModel.session(draft="mtp")) greedy output
    identical to stepping's."""
    from strata import cli

    path = tmp_path / "mtp.gguf"
    seed = int(np.random.default_rng().integers(1 << 30))
    assert cli.main(["synth", str(path), "--arch", arch, "--mtp", "--seed", str(seed)]) == 0
    capsys.readouterr()
    assert cli.main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    count = 32 if arch == "qwen4exp" else 20
    assert f"MTP block     {count} tensors" in out and "--draft mtp drafts with it" in out
    assert "warning" not in out
    with strata.load(path, engine="reference") as model:
        assert not model.file.warnings
        prompt = _prompt(np.random.default_rng(), model.file.geometry.n_vocab, 6)
        want = model.session().complete(prompt, max_tokens=10, temperature=0).tokens
        session = model.session(draft="mtp", draft_tokens=2)
        assert session.complete(prompt, max_tokens=10, temperature=0).tokens == want


def test_mtp_drafts_need_a_block(files):
    with strata.load(files["qwen35moe"][1], engine="reference") as model:
        with pytest.raises(strata.InvalidArgument, match="draft 'mtp': this qwen35moe file has no MTP block"):
            model.session(draft="mtp")
        assert model.session(draft="lookup") is not None


def test_qwen4exps_block_attends_through_its_own_indexer(files):
    """Past the QSA budget the block's rows see fewer tokens than dense attention would give them: the oracle
    held to dense attention then differs where the QSA oracle agrees (the oracle test above)."""
    rng = np.random.default_rng()
    with ModelFile(files["qwen4exp"][0]) as f:
        reference = Reference(f)
        block, qsa, dense = MtpBlock(f.geometry, reference.weights), _torch_block(reference), _torch_block(reference)
        dense.indexer = None
        hidden = rng.standard_normal((16, block.width)).astype(np.float32)
        ids = rng.integers(0, f.geometry.n_vocab, 16)
        logits = block.forward(block.new_cache(), hidden, ids)[0]
        with_qsa = np.stack([qsa.step(hidden[j], int(ids[j]))[0].numpy() for j in range(16)])
        with_dense = np.stack([dense.step(hidden[j], int(ids[j]))[0].numpy() for j in range(16)])
        assert relative_error(logits, with_qsa) < TOLERANCE
        # rows 0..11 see every token (2 blocks + a tail of up to 3 cover them); later rows leave some out
        assert relative_error(logits[:11], with_dense[:11]) < TOLERANCE
        assert relative_error(logits[12:], with_dense[12:]) > 1e-3


def _dict_reference(path) -> tuple[dict[str, np.ndarray], strata.models.Geometry]:
    with ModelFile(path) as f:
        weights = Reference(f).weights
        return {name: weights.get(name) for name in f.tensors}, f.geometry


@pytest.mark.parametrize(("arch", "name", "edit", "fragment"), [
    ("qwen3next", "blk.4.nextn.eh_proj.weight", "drop", "MTP block: tensor 'blk.4.nextn.eh_proj.weight' .* is missing"),
    ("qwen3next", "blk.4.nextn.eh_proj.weight", "reshape",
     r"MTP block: tensor 'blk.4.nextn.eh_proj.weight': expected ne \(512, 256\), found \(256, 512\)"),
    ("qwen4exp", "blk.4.nextn.hc_head_up.weight", "drop",
     "qwen4exp MTP block: tensor 'blk.4.nextn.hc_head_up.weight' .* is missing"),
    ("qwen4exp", "blk.4.nextn.hnorm.weight", "one stream",
     r"qwen4exp MTP block: tensor 'blk.4.nextn.hnorm.weight': expected ne \(1024,\), found \(256,\)"),
])
def test_a_malformed_block_is_named(files, arch, name, edit, fragment):
    tensors, g = _dict_reference(files[arch][0])
    assert g.n_layer == 4 and g.n_embd == 256
    if edit == "drop":
        del tensors[name]
    elif edit == "reshape":
        tensors[name] = tensors[name].T.copy()
    else:
        tensors[name] = tensors[name][:g.n_embd].copy()
    with pytest.raises(strata.FormatError, match=fragment):
        MtpBlock(g, Weights(tensors))


@pytest.mark.parametrize("arch", ["qwen4exp", "qwen35moe"])
def test_a_block_with_merged_expert_gate_and_up_runs_as_with_both(files, arch):
    rng = np.random.default_rng()
    tensors, g = _dict_reference(files[arch][0])
    p = f"blk.{g.n_layer}."
    merged = dict(tensors)
    merged[p + "ffn_gate_up_exps.weight"] = np.concatenate(
        [merged.pop(p + "ffn_gate_exps.weight"), merged.pop(p + "ffn_up_exps.weight")], axis=1)
    hidden, ids = rng.standard_normal((3, g.hc_width)).astype(np.float32), rng.integers(0, g.n_vocab, 3)
    separate, joined = MtpBlock(g, Weights(tensors)), MtpBlock(g, Weights(merged))
    want, got = separate.forward(separate.new_cache(), hidden, ids), joined.forward(joined.new_cache(), hidden, ids)
    assert relative_error(got[0], want[0]) < TOLERANCE and relative_error(got[1], want[1]) < TOLERANCE
