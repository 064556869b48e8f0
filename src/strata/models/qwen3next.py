"""qwen3next (Qwen3-Next) and qwen35moe (Qwen3.5/3.6 MoE): one residual stream with pre-RMSNorms.

The two differ only in the GDN b/a projections (qwen3next: one interleaved ssm_ba; qwen35moe: ssm_beta and
ssm_alpha) and in the MRoPE sections key (qwen35moe only). docs/models/qwen3next.md §2.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from strata.models import common
from strata.models.geometry import Alternative, Geometry, Role, TensorSpec
from strata.models.keys import MetadataReader

ARCHS = ("qwen3next", "qwen35moe")
# Plain attention (no QSA), SiLU GDN output gate; qwen3next's interleaved ssm_ba reads grouped heads, qwen35moe's
# separate ssm_beta/ssm_alpha tiled heads (§3.1).
VARIANTS = {
    "qwen3next": dict(gdn_tiled_heads=False, gdn_interleaved_ba=True, gdn_sigmoid_gate=False, qsa_block=0),
    "qwen35moe": dict(gdn_tiled_heads=True, gdn_interleaved_ba=False, gdn_sigmoid_gate=False, qsa_block=0),
}


def geometry(kv: Mapping[str, Any], arch: str, n_vocab: int) -> Geometry:
    g = Geometry(**common.read_common(MetadataReader(kv, arch), n_vocab, VARIANTS[arch]))
    validate(g)
    return g


def validate(g: Geometry) -> None:
    common.validate_common(g)


def metadata(g: Geometry) -> list[common.MetadataItem]:
    return common.write_common(g) + common.variant_items(g, VARIANTS[g.arch])


def _beta_alpha(g: Geometry, layer: int) -> list[TensorSpec]:
    p, e, hv = f"blk.{layer}.", g.n_embd, g.ssm_n_v_heads
    if g.gdn_interleaved_ba:
        return [common.spec(p + "ssm_ba.weight", (e, 2 * hv), layer)]   # rows per k-head: [b.., a..]
    return [common.spec(p + "ssm_beta.weight", (e, hv), layer), common.spec(p + "ssm_alpha.weight", (e, hv), layer)]


def inventory(g: Geometry) -> list[TensorSpec]:
    e = g.n_embd
    specs = [common.embedding(g)]
    for layer in range(g.n_layer):
        p = f"blk.{layer}."
        specs.append(common.spec(p + "attn_norm.weight", (e,), layer))
        if g.recurrent[layer]:
            specs += common.gdn_tensors(g, layer, _beta_alpha(g, layer))
        else:
            specs += common.attention_tensors(g, layer)
        specs.append(common.spec(p + "post_attention_norm.weight", (e,), layer))
        specs += common.moe_tensors(g, layer)
    specs += [common.spec("output_norm.weight", (e,), None), common.spec("output.weight", (e, g.n_vocab), None)]
    return specs


def mtp_inventory(g: Geometry) -> list[TensorSpec]:
    """The MTP block's required tensors, as llama.cpp's converter writes the checkpoint's `mtp.*` (qwen3next.md
    §2.3): block n_layer is a full-attention layer with the model's MoE, plus the nextn.* input and head tensors.
    Its norms are stored 1 + w as the main layers' (the converter's `norm.weight` rule renames them first)."""
    layer, e = g.n_layer, g.n_embd
    p = f"blk.{layer}."
    return [
        common.spec(p + "nextn.eh_proj.weight", (2 * e, e), layer),      # inputs: [enorm(embed) | hnorm(hidden)]
        common.spec(p + "nextn.enorm.weight", (e,), layer),
        common.spec(p + "nextn.hnorm.weight", (e,), layer),
        common.spec(p + "attn_norm.weight", (e,), layer),
        *common.attention_tensors(g, layer),
        common.spec(p + "post_attention_norm.weight", (e,), layer),
        *common.moe_tensors(g, layer),
        common.spec(p + "nextn.shared_head_norm.weight", (e,), layer),
    ]


def mtp_optional(g: Geometry) -> list[TensorSpec]:
    """The MTP block's own embedding and LM head, which a file may hold (else the main model's are read)."""
    layer, p = g.n_layer, f"blk.{g.n_layer}."
    return [common.spec(p + "nextn.embed_tokens.weight", (g.n_embd, g.n_vocab), layer, Role.ROW_GATHERED),
            common.spec(p + "nextn.shared_head_head.weight", (g.n_embd, g.n_vocab), layer)]


def alternatives(g: Geometry) -> list[Alternative]:
    alts = [common.merged_experts(g, layer) for layer in range(g.n_layer)]
    if g.arch == "qwen3next":
        # older qwen3next GGUFs hold the raw HF in_proj_qkvz instead of attn_qkv + attn_gate (§2.2)
        for layer in g.recurrent_layers:
            p = f"blk.{layer}."
            alts.append(Alternative((p + "attn_qkv.weight", p + "attn_gate.weight"), common.spec(
                p + "ssm_in.weight", (g.n_embd, g.ssm_conv_dim + g.ssm_value_dim), layer)))
    return alts


def released(arch: str) -> Geometry:
    """qwen3next: Qwen3-Next-80B-A3B; qwen35moe: Qwen3.5-35B-A3B (qwen3next.md §1)."""
    n_layer, n_vocab, sections, n_expert, used = {
        "qwen3next": (48, 151936, (), 512, 10),
        "qwen35moe": (40, 248320, (11, 11, 10, 0), 256, 8),
    }[arch]
    return Geometry(
        arch=arch, n_layer=n_layer, n_embd=2048, n_vocab=n_vocab, context_length=262144,
        n_head=16, n_head_kv=2, head_dim=256, rope_dim=64, rope_theta=1e7, rope_sections=sections, rms_eps=1e-6,
        recurrent=tuple((i + 1) % 4 != 0 for i in range(n_layer)),
        ssm_n_k_heads=16, ssm_n_v_heads=32, ssm_head_k_dim=128, ssm_head_v_dim=128, ssm_conv_kernel=4,
        n_expert=n_expert, n_expert_used=used, expert_ff=512, shared_ff=512,
        hc_count=0, hc_rank=0, indexer_n_heads=0, indexer_head_dim=0, indexer_top_k=0, compress_ratios=(),
        ple_layers=(), ple_ngram=0, ple_heads_per_ngram=0, ple_conv_kernel=0, ple_eos=0, ple_head_dim=0,
        ple_multipliers=(), ple_head_offsets=(), ple_head_sizes=(), ple_rows=0, **VARIANTS[arch],
    )
