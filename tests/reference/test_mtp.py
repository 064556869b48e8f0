"""The reference's MTP block (strata.reference.mtp) on tiny synthesized files with a block: against an independent
torch implementation of vLLM's / llama.cpp's equations, its chained drafts against the block run step by step, its
cache through a prompt fed at once, token by token and through drafted sessions; errors for a missing or malformed
block."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

import strata
from strata.format import ModelFile
from strata.generation import Session
from strata.generation.draft_length import FixedDraftLength
from strata.reference import Reference
from strata.reference.engine import ReferenceEngine
from strata.reference.mtp import MtpBlock, MtpDrafter, MtpReference
from strata.reference.weights import Weights
from strata.synth import presets, synthesize
from support.compare import relative_error
from support.mtp_torch import TorchMtp

ARCHS = ("qwen3next", "qwen35moe")
TOLERANCE = 1e-5  # the reference rounds activations to float32 (about 1e-7 seen); the torch oracle is float64


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """arch -> (file with an MTP block, the same seed's file without it)."""
    root = tmp_path_factory.mktemp("mtp")
    return {arch: (synthesize(root / f"{arch}-mtp.gguf", arch, seed=11, mtp=True),
                   synthesize(root / f"{arch}.gguf", arch, seed=11)) for arch in ARCHS}


def _torch_block(reference: Reference) -> TorchMtp:
    g, w = reference.geometry, reference.weights
    return TorchMtp(w.get, w.has, layer=g.n_layer, n_head=g.n_head, n_head_kv=g.n_head_kv, head_dim=g.head_dim,
                    rope_dim=g.rope_dim, rope_theta=g.rope_theta, eps=g.rms_eps, top_k=g.n_expert_used)


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
        for rows in (4, 1, 3):  # rows in one call, then more after them in the same cache
            hidden = rng.standard_normal((rows, g.n_embd)).astype(np.float32)
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
        prompt, token = _prompt(rng, g.n_vocab, 6), int(rng.integers(0, g.n_vocab))
        mtp.forward(prompt)
        hidden = mtp.main.last_hidden
        before = copy.deepcopy(mtp.state)
        drafts = MtpDrafter(mtp).propose(prompt + [token], 4)
        assert len(drafts) == 4
        # the block's cache is left as it was
        assert np.array_equal(mtp.state[1].k, before[1].k) and np.array_equal(mtp.state[2], before[2])

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
        prompt = _prompt(rng, f.geometry.n_vocab, 7)
        at_once, by_token = MtpReference(Reference(f)), MtpReference(Reference(f))
        at_once.forward(prompt[:5])
        at_once.forward(prompt[5:])
        for token in prompt:
            by_token.forward([token])
        for a, b in ((at_once.state[1].k, by_token.state[1].k), (at_once.state[1].v, by_token.state[1].v)):
            assert a.shape[1] == len(prompt) - 1
            assert relative_error(a, b) < TOLERANCE
        assert relative_error(at_once.state[2], by_token.state[2]) < TOLERANCE


@pytest.mark.parametrize("arch", ARCHS)
def test_mtp_drafted_greedy_output_is_stepping_output(files, arch):
    """Drafts of every step checked (a fixed length) and the adaptive policy through ReferenceModel.session: the
    tokens are stepping's, and the block's cache afterwards is the one of the final sequence fed token by token."""
    rng = np.random.default_rng()
    with strata.load(files[arch][0], engine="reference") as model:
        prompt = _prompt(rng, model.file.geometry.n_vocab, 5)
        want = model.session().complete(prompt, max_tokens=12, temperature=0).tokens
        adaptive = model.session(draft="mtp", draft_tokens=3)
        assert adaptive.complete(prompt, max_tokens=12, temperature=0).tokens == want
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
            assert session.complete(prompt, max_tokens=12, temperature=0).tokens == want
            assert session.stats.drafted > 0
            _assert_in_step(mtp, session.tokens[:-1], model.file)


def _assert_in_step(mtp: MtpReference, fed: list[int], file) -> None:
    """The block's cache and last hidden state are those of `fed` fed token by token."""
    replay = MtpReference(Reference(file))
    for token in fed:
        replay.forward([token])
    (_, cache, hidden), (_, want_cache, want_hidden) = mtp.state, replay.state
    assert mtp.n_past == len(fed) and cache.k.shape == want_cache.k.shape
    for got, want in ((cache.k, want_cache.k), (cache.v, want_cache.v), (hidden, want_hidden)):
        assert relative_error(got, want) < TOLERANCE


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


def test_mtp_drafts_need_a_block(files):
    with strata.load(files["qwen35moe"][1], engine="reference") as model:
        with pytest.raises(strata.InvalidArgument, match="draft 'mtp': this qwen35moe file has no MTP block"):
            model.session(draft="mtp")
        assert model.session(draft="lookup") is not None


def test_qwen4exps_block_is_not_run():
    g = dataclasses.replace(presets.geometry("qwen4exp"), n_mtp=1)
    with pytest.raises(strata.InvalidArgument, match="draft 'mtp': the MTP block of qwen4exp is not supported"):
        MtpReference(Reference(geometry=g, weights={}))


def _dict_reference(path) -> tuple[dict[str, np.ndarray], strata.models.Geometry]:
    with ModelFile(path) as f:
        weights = Reference(f).weights
        return {name: weights.get(name) for name in f.tensors}, f.geometry


@pytest.mark.parametrize(("edit", "fragment"), [
    ("drop", "MTP block: tensor 'blk.4.nextn.eh_proj.weight' .* is missing"),
    ("reshape", r"MTP block: tensor 'blk.4.nextn.eh_proj.weight': expected ne \(512, 256\), found \(256, 512\)"),
])
def test_a_malformed_block_is_named(files, edit, fragment):
    tensors, g = _dict_reference(files["qwen3next"][0])
    assert g.n_layer == 4 and g.n_embd == 256
    name = "blk.4.nextn.eh_proj.weight"
    if edit == "drop":
        del tensors[name]
    else:
        tensors[name] = tensors[name].T.copy()
    with pytest.raises(strata.FormatError, match=fragment):
        MtpBlock(g, Weights(tensors))


def test_a_block_with_merged_expert_gate_and_up_runs_as_with_both(files):
    rng = np.random.default_rng()
    tensors, g = _dict_reference(files["qwen35moe"][0])
    p = f"blk.{g.n_layer}."
    merged = dict(tensors)
    merged[p + "ffn_gate_up_exps.weight"] = np.concatenate(
        [merged.pop(p + "ffn_gate_exps.weight"), merged.pop(p + "ffn_up_exps.weight")], axis=1)
    hidden, ids = rng.standard_normal((3, g.n_embd)).astype(np.float32), rng.integers(0, g.n_vocab, 3)
    separate, joined = MtpBlock(g, Weights(tensors)), MtpBlock(g, Weights(merged))
    want, got = separate.forward(separate.new_cache(), hidden, ids), joined.forward(joined.new_cache(), hidden, ids)
    assert relative_error(got[0], want[0]) < TOLERANCE and relative_error(got[1], want[1]) < TOLERANCE
