"""Tiny random transformers models of the three architectures, for the tests that compare strata with HF.

Builders (config, random weights, save + convert), and two edits for the decode tests: weights rounded so
that the converter's Q8_0 / F16 encoding is lossless, and an LM head that makes greedy decoding robust to
the GPU's activation quantization noise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from strata.convert import convert
from strata.convert.transforms import grouped_to_tiled
from strata.errors import InvalidArgument

LIN, ATT = "linear_attention", "full_attention"
ARCHS = ("qwen4exp", "qwen3next", "qwen35moe")
# (hidden size, layer types); the PLE layer (qwen4exp) is index 1, which every layout keeps recurrent.
CONFIGS = [(64, [LIN, LIN, ATT, LIN, ATT]), (96, [LIN, LIN, ATT, ATT]), (128, [LIN, LIN, LIN, ATT, LIN, ATT])]
VOCAB, EOS = 512, 7
BUDGET, RATIO = 16, 4          # 4 blocks: QSA drops blocks from 20 visible tokens on
# qwen4exp geometries beside the released one (ratio 4, sigmoid gate) that a file may state: other QSA blocks,
# one that divides no power of two, and transformers' other GDN output gate.
QWEN4EXP_VARIANTS = (dict(budget=24, ratio=8, output_gate="silu"), dict(budget=12, ratio=3), dict(budget=8, ratio=2))
# Every architecture as released, and qwen4exp with the other geometries: (arch, hf_model options).
MODELS = [(arch, {}) for arch in ARCHS] + [("qwen4exp", options) for options in QWEN4EXP_VARIANTS]


def model_id(model: tuple[str, dict]) -> str:
    """A test id for one of MODELS, e.g. "qwen4exp-budget12-ratio3"."""
    arch, options = model
    return "-".join([arch, *(f"{k}{v}" for k, v in options.items())])
Q8_BLOCK = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][0]


def _common(hidden: int, layer_types: list[str]) -> dict:
    return dict(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=len(layer_types), num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, max_position_embeddings=4096, linear_conv_kernel_dim=4,
                linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts_per_tok=2, num_experts=8,
                layer_types=layer_types, eos_token_id=EOS, bos_token_id=EOS)


def _rope(sections: bool) -> dict:
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
    return {**rope, "mrope_section": [2, 1, 1], "mrope_interleaved": True} if sections else rope


def hf_model(arch: str, hidden: int, layer_types: list[str], *, budget: int = BUDGET, ratio: int = RATIO,
             output_gate: str = "sigmoid") -> torch.nn.Module:
    """An untrained HF causal LM of `arch` (one of ARCHS) in eval mode, float32; `budget`, `ratio` (QSA) and
    `output_gate` (the GDN gate) shape qwen4exp only."""
    if arch == "qwen4exp":
        from transformers.models.qwen4_exp import Qwen4ExpForCausalLM, Qwen4ExpTextConfig
        # 8 indexer heads: relu(q.k) summed over 2 heads is exactly 0 for a quarter of the blocks, and exact
        # ties at the top-k cut are broken differently by torch.topk and by the reference (lower index). Over 8
        # heads a zero is rare, not impossible: test_parity draws again where one still ties at a cut.
        cfg = Qwen4ExpTextConfig(**_common(hidden, layer_types), rope_parameters=_rope(True),
                                 linear_num_value_heads=6, hc_count=4, hc_lowrank=16, ple_layer_ids=[2],
                                 ple_embed_dim=hidden, ngram_vocab_size_base=1000, split_ngram_parts=2,
                                 indexer_n_heads=8, indexer_kv_heads=1, indexer_head_dim=16,
                                 indexer_budget=budget, indexer_compress_ratio=ratio, output_gate_type=output_gate)
        return Qwen4ExpForCausalLM(cfg).eval()
    if arch == "qwen3next":
        from transformers.models.qwen3_next import Qwen3NextConfig, Qwen3NextForCausalLM
        cfg = Qwen3NextConfig(**_common(hidden, layer_types), rope_parameters=_rope(False),
                              linear_num_value_heads=4, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
        return Qwen3NextForCausalLM(cfg).eval()
    from transformers.models.qwen3_5_moe import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
    cfg = Qwen3_5MoeTextConfig(**_common(hidden, layer_types), rope_parameters=_rope(True), linear_num_value_heads=4)
    return Qwen3_5MoeForCausalLM(cfg).eval()


def randomize(model: torch.nn.Module) -> None:
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


def random_model(arch: str, config: int, seed: int, **options: Any) -> torch.nn.Module:
    """hf_model of CONFIGS[config] with `options`, randomized from torch seed `seed`."""
    torch.manual_seed(seed)
    model = hf_model(arch, *CONFIGS[config], **options)
    randomize(model)
    return model


def save_and_convert(model: torch.nn.Module, directory: Path, outtype: str) -> Path:
    """save_pretrained into directory/hf (once: later calls convert the same checkpoint), then strata's
    converter -> directory/model-<outtype>.gguf."""
    hf_dir = directory / "hf"
    if not hf_dir.exists():
        model.save_pretrained(hf_dir)
    return convert(hf_dir, directory / f"model-{outtype}.gguf", outtype=outtype)


# ---- a head that decodes robustly ----

def peak_head(model: torch.nn.Module, rng: np.random.Generator, echo: float = 3.0, embed_scale: float = 3.0) -> None:
    """Make greedy decoding robust to ~1e-2 relative logit noise: after token t the next token is almost
    always perm[t] for a random permutation perm of the vocabulary.

    A random model's top-1/top-2 logit gap is a continuous variable with density at 0, so over 64 steps
    some gap falls below any noise level. Here the head's row perm[t] gets `echo` times the unit embedding
    of t, and the embeddings are scaled by `embed_scale` so that they stay a large share of the final
    residual stream: the winner then leads by 0.25..0.5 of max|logit| at every one of 64 positions (measured
    on config 0, 15 seeds per arch; embed_scale 2 left 0.04..0.3), while the other logits still come from the
    whole network (their spread is about 7x below max|logit| instead of 3x for a plain random head). Call
    before make_q8_0_exact, which must see the final weights.
    """
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    if embed.data_ptr() == head.data_ptr():
        raise InvalidArgument("peak_head needs an untied LM head: the echo rows would change the embeddings too")
    perm = torch.from_numpy(rng.permutation(embed.shape[0]))
    with torch.no_grad():
        embed.mul_(embed_scale)
        echo_rows = torch.empty_like(head)
        echo_rows[perm] = embed / embed.norm(dim=1, keepdim=True)
        head.add_(echo * echo_rows)


# ---- lossless Q8_0 ----

def _q8_0_round(rows: np.ndarray) -> np.ndarray:
    """rows [n, k*32] -> the values gguf's Q8_0 encoder then decoder gives: d = fp16(max|w| / 127) per block
    of 32, w' = d * round(w / d). Encoding w' again reproduces it exactly: its block maximum is 127 * d."""
    q8 = gguf.GGMLQuantizationType.Q8_0
    return gguf.quants.dequantize(gguf.quants.quantize(np.ascontiguousarray(rows), q8), q8).reshape(rows.shape)


def _q8_0_round_ssm_out(w: np.ndarray, arch: str, config) -> np.ndarray:
    """_q8_0_round of a linear_attn.out_proj weight. In the qwen35 layout (qwen4exp, qwen35moe) the converter
    moves its V-head columns to the tiled order (tensor_map._out35), so the Q8_0 blocks are 32 consecutive
    columns in *that* order: round there and move back."""
    if arch == "qwen3next":   # HF head order kept
        return _q8_0_round(w)
    n_k, n_v = config.linear_num_key_heads, config.linear_num_value_heads
    tiled = _q8_0_round(grouped_to_tiled(w, n_k, n_v, axis=1))
    return grouped_to_tiled(tiled, n_v // n_k, n_v, axis=1)   # swapping the two head counts inverts it


def make_q8_0_exact(model: torch.nn.Module, arch: str) -> None:
    """Round every weight matrix so that convert(outtype="q8_0") stores it without loss.

    The converter's rule (convert.encode.tensor_type): a 2-D+ tensor is Q8_0 where ne0 (the HF last dim) is a
    multiple of 32, else F16; some (router, conv, norms) stay F32, where the rounding is harmless. 1-D
    parameters are always F32 and stay untouched.
    """
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim < 2:
                continue
            w = p.detach().numpy().astype(np.float32)
            if w.shape[-1] % Q8_BLOCK:
                rounded = w.astype(np.float16).astype(np.float32)
            elif name.endswith("linear_attn.out_proj.weight"):
                rounded = _q8_0_round_ssm_out(w, arch, model.config)
            else:
                rounded = _q8_0_round(w.reshape(-1, w.shape[-1])).reshape(w.shape)
            p.copy_(torch.from_numpy(rounded))
