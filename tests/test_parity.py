"""Live parity of strata.reference with transformers: tiny random HF models (CPU torch, float32, eval) go
through save_pretrained -> strata.convert.convert(outtype="f32") -> strata.format.inspect -> Reference.

Criterion (per position): max |logit diff| <= 1e-4 * max |logit|, and the same argmax. Both sides compute in
float32 with different summation orders (the reference accumulates in float64), so agreement is ~1e-6
relative; 1e-4 leaves room for the float32 rounding that compounds over layers without hiding a wrong
formula (a wrong sign, head order or mask shows up at 1e-2 or worse).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from strata.convert import convert  # noqa: E402
from strata.format import inspect  # noqa: E402
from strata.reference import Reference  # noqa: E402

LIN, ATT = "linear_attention", "full_attention"
# (hidden size, layer types); the PLE layer (qwen4exp) is index 1, which every layout keeps recurrent.
CONFIGS = [(64, [LIN, LIN, ATT, LIN, ATT]), (96, [LIN, LIN, ATT, ATT]), (128, [LIN, LIN, LIN, ATT, LIN, ATT])]
VOCAB, EOS, SEQ, SPLIT = 512, 7, 56, 37
BUDGET, RATIO = 16, 4          # 4 blocks: QSA drops blocks from 20 visible tokens on
TOLERANCE = 1e-4


def _common(hidden: int, layer_types: list[str]) -> dict:
    return dict(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=len(layer_types), num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, max_position_embeddings=4096, linear_conv_kernel_dim=4,
                linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts_per_tok=2, num_experts=8,
                layer_types=layer_types, eos_token_id=EOS, bos_token_id=EOS)


def _rope(sections: bool) -> dict:
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
    return {**rope, "mrope_section": [2, 1, 1], "mrope_interleaved": True} if sections else rope


def _hf_model(arch: str, hidden: int, layer_types: list[str]):
    if arch == "qwen4exp":
        from transformers.models.qwen4_exp import Qwen4ExpForCausalLM, Qwen4ExpTextConfig
        # 8 indexer heads: relu(q.k) summed over 2 heads is exactly 0 for a quarter of the blocks, and exact
        # ties at the top-k cut are broken differently by torch.topk and by the reference (lower index).
        cfg = Qwen4ExpTextConfig(**_common(hidden, layer_types), rope_parameters=_rope(True),
                                 linear_num_value_heads=6, hc_count=4, hc_lowrank=16, ple_layer_ids=[2],
                                 ple_embed_dim=hidden, ngram_vocab_size_base=1000, split_ngram_parts=2,
                                 indexer_n_heads=8, indexer_kv_heads=1, indexer_head_dim=16,
                                 indexer_budget=BUDGET, indexer_compress_ratio=RATIO, output_gate_type="sigmoid")
        return Qwen4ExpForCausalLM(cfg)
    if arch == "qwen3next":
        from transformers.models.qwen3_next import Qwen3NextConfig, Qwen3NextForCausalLM
        cfg = Qwen3NextConfig(**_common(hidden, layer_types), rope_parameters=_rope(False),
                              linear_num_value_heads=4, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
        return Qwen3NextForCausalLM(cfg)
    from transformers.models.qwen3_5_moe import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
    cfg = Qwen3_5MoeTextConfig(**_common(hidden, layer_types), rope_parameters=_rope(True), linear_num_value_heads=4)
    return Qwen3_5MoeForCausalLM(cfg)


def _randomize(model) -> None:
    """Every parameter random and O(1) in effect (HF initialises norms and the PLE conv to zero)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "A_log" in name:
                # Moderate decay: transformers' chunked prefill multiplies by exp(cumulative decay), which
                # underflows float32 past about -87 and would make the oracle itself inexact.
                p.copy_(torch.empty_like(p).uniform_(0.02, 0.3).log())
            elif "linear_attn.norm" in name:   # a plain gamma (no 1 + w)
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif p.ndim == 1:
                p.copy_(0.2 * torch.randn_like(p))
            elif "embed" in name:
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)


def _check_qsa_dumps(dumps: list[dict], seed: int) -> None:
    """QSA really dropped blocks, and no exact score tie decided a selection (that would test torch.topk)."""
    dropped = False
    for d in dumps:
        for blocks, scores in zip(d.get("qsa_blocks", []), d.get("qsa_scores", [])):
            keep = len(blocks)
            dropped |= keep < len(scores)
            if 0 < keep < len(scores):
                ordered = np.sort(scores)[::-1]
                assert ordered[keep - 1] != ordered[keep], f"exact QSA score tie at the top-k cut (seed={seed})"
    assert dropped or not any("qsa_blocks" in d for d in dumps), f"no QSA row dropped a block (seed={seed})"


@pytest.mark.parametrize("arch", ["qwen4exp", "qwen3next", "qwen35moe"])
@pytest.mark.parametrize("config", range(len(CONFIGS)))
def test_reference_matches_transformers(arch: str, config: int, rng: np.random.Generator, tmp_path: Path) -> None:
    seed = int(rng.integers(2**31))
    torch.manual_seed(seed)
    hidden, layer_types = CONFIGS[config]
    model = _hf_model(arch, hidden, layer_types).eval()
    _randomize(model)
    model.save_pretrained(tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "model.gguf", outtype="f32")

    ids = rng.integers(0, VOCAB, SEQ)
    ids[rng.choice(SEQ, 4, replace=False)] = EOS     # PLE n-gram resets (qwen4exp), plain tokens elsewhere
    ids[SPLIT - 1:SPLIT + 1] = EOS                   # two EOS in a row, straddling the chunk boundary
    with torch.no_grad():
        expected = model(torch.tensor(ids)[None]).logits[0].numpy()

    with inspect(tmp_path / "model.gguf") as model_file:
        ref = Reference(model_file)
        prompt, dumps = ref.forward(ids[:SPLIT], dump=True)
        steps = [ref.forward(ids[i:i + 1]) for i in range(SPLIT, SEQ)]   # the stateful decode path
    got = np.concatenate([prompt, *steps])

    assert np.isfinite(got).all(), f"non-finite logits (seed={seed})"
    rel = np.abs(got - expected).max(axis=1) / np.abs(expected).max(axis=1)
    print(f"{arch} config {config} seed={seed}: worst relative logit difference {rel.max():.3e}")
    assert rel.max() <= TOLERANCE, f"position {rel.argmax()}: relative difference {rel.max():.3e} (seed={seed})"
    assert (got.argmax(axis=1) == expected.argmax(axis=1)).all(), f"argmax differs (seed={seed})"
    _check_qsa_dumps(dumps, seed)
