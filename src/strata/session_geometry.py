"""The geometry the native decode session reads (cuda/include/strata/decode_session.hpp, DecodeGeometry),
as a plain dict built from a strata.models.Geometry."""

from __future__ import annotations

from typing import Any

from strata.models import Geometry
from strata.reference.model import DEFAULT_COMPRESS_RATIO


def native_geometry(g: Geometry) -> dict[str, Any]:
    """Every field the native session needs; fields the architecture lacks are 0 (ple_layer -1)."""
    hc = g.arch == "qwen4exp"
    return {
        "arch": g.arch, "n_layer": g.n_layer, "n_embd": g.n_embd, "n_vocab": g.n_vocab,
        "recurrent": [bool(r) for r in g.recurrent],
        "n_head": g.n_head, "n_head_kv": g.n_head_kv, "head_dim": g.head_dim,
        "rope_dim": g.rope_dim, "rope_theta": float(g.rope_theta), "rms_eps": float(g.rms_eps),
        "ssm_k_heads": g.ssm_n_k_heads, "ssm_v_heads": g.ssm_n_v_heads, "ssm_head_k_dim": g.ssm_head_k_dim,
        "ssm_head_v_dim": g.ssm_head_v_dim, "ssm_conv_kernel": g.ssm_conv_kernel,
        "n_expert": g.n_expert, "n_expert_used": g.n_expert_used, "expert_ff": g.expert_ff,
        "shared_ff": g.shared_ff,
        "hc_count": g.hc_count if hc else 0, "hc_rank": g.hc_rank if hc else 0,
        "indexer_heads": g.indexer_n_heads if hc else 0, "indexer_head_dim": g.indexer_head_dim if hc else 0,
        "indexer_budget": g.indexer_top_k if hc else 0,
        "compress_ratios": [int(r) if r > 0 else DEFAULT_COMPRESS_RATIO for r in g.compress_ratios] if hc else [],
        "ple_layer": g.ple_layers[0] if hc and g.ple_layers else -1,
        "ple_ngram": g.ple_ngram, "ple_conv_kernel": g.ple_conv_kernel,
        "ple_n_heads": g.ple_n_heads, "ple_head_dim": g.ple_head_dim,
    }
