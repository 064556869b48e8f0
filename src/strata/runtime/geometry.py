"""The geometry the native core reads (cuda/include/strata/geometry.hpp, ModelGeometry): sizes and the flags of
the architecture's variant, as a plain dict built from a strata.models.Geometry. No architecture name crosses."""

from __future__ import annotations

from typing import Any

from strata.models import Geometry


def native_geometry(g: Geometry) -> dict[str, Any]:
    """Every field of ModelGeometry; sizes the architecture lacks are 0 (ple_layer -1, compress_ratios empty)."""
    ple = g.ple
    return {
        "n_layer": g.n_layer, "n_embd": g.n_embd, "n_vocab": g.n_vocab,
        "recurrent": [bool(r) for r in g.recurrent],
        "n_head": g.n_head, "n_head_kv": g.n_head_kv, "head_dim": g.head_dim,
        "rope_dim": g.rope_dim, "rope_theta": float(g.rope_theta), "rms_eps": float(g.rms_eps),
        "ssm_n_k_heads": g.ssm_n_k_heads, "ssm_n_v_heads": g.ssm_n_v_heads, "ssm_head_k_dim": g.ssm_head_k_dim,
        "ssm_head_v_dim": g.ssm_head_v_dim, "ssm_conv_kernel": g.ssm_conv_kernel,
        "gdn_tiled_heads": g.gdn_tiled_heads, "gdn_interleaved_ba": g.gdn_interleaved_ba,
        "gdn_sigmoid_gate": g.gdn_sigmoid_gate,
        "n_expert": g.n_expert, "n_expert_used": g.n_expert_used, "expert_ff": g.expert_ff,
        "shared_ff": g.shared_ff,
        "hc_count": g.hc_count, "hc_rank": g.hc_rank,
        "indexer_n_heads": g.indexer_n_heads, "indexer_head_dim": g.indexer_head_dim,
        "indexer_top_k": g.indexer_top_k,
        "compress_ratios": [g.qsa_ratio(layer) for layer in range(g.n_layer)] if g.qsa_block else [],
        "ple_layer": g.ple_layers[0] if ple else -1,
        "ple_ngram": g.ple_ngram, "ple_conv_kernel": g.ple_conv_kernel,
        "ple_n_heads": ple.n_heads if ple else 0, "ple_head_dim": g.ple_head_dim,
    }
