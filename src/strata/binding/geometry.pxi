# The model geometry the core reads (strata/geometry.hpp), from strata.runtime.geometry's dict.
from strata.libstrata.geometry cimport ModelGeometry

_GEOMETRY_INTS = ("n_layer", "n_embd", "n_vocab", "n_head", "n_head_kv", "head_dim", "rope_dim", "ssm_n_k_heads",
                  "ssm_n_v_heads", "ssm_head_k_dim", "ssm_head_v_dim", "ssm_conv_kernel", "n_expert", "n_expert_used",
                  "expert_ff", "shared_ff", "hc_count", "hc_rank", "indexer_n_heads", "indexer_head_dim",
                  "indexer_top_k", "ple_layer", "ple_ngram", "ple_conv_kernel", "ple_n_heads", "ple_head_dim")
_GEOMETRY_FLAGS = ("gdn_tiled_heads", "gdn_interleaved_ba", "gdn_sigmoid_gate")
_GEOMETRY_FIELDS = frozenset(_GEOMETRY_INTS + _GEOMETRY_FLAGS + ("recurrent", "rope_theta", "rms_eps",
                                                                 "compress_ratios"))


cdef ModelGeometry model_geometry(dict g) except *:
    """The core's ModelGeometry from the fields strata.runtime.geometry.native_geometry writes; names a missing
    or unknown field."""
    missing = sorted(_GEOMETRY_FIELDS - g.keys())
    unknown = sorted(g.keys() - _GEOMETRY_FIELDS)
    if missing or unknown:
        raise InvalidArgument(f"model geometry: {'missing ' + ', '.join(missing) if missing else ''}"
                              f"{'; ' if missing and unknown else ''}"
                              f"{'unknown ' + ', '.join(unknown) if unknown else ''} "
                              "(strata.runtime.geometry.native_geometry writes every field)")
    cdef ModelGeometry c
    c.n_layer, c.n_embd, c.n_vocab = g["n_layer"], g["n_embd"], g["n_vocab"]
    c.n_head, c.n_head_kv, c.head_dim, c.rope_dim = g["n_head"], g["n_head_kv"], g["head_dim"], g["rope_dim"]
    c.rope_theta, c.rms_eps = g["rope_theta"], g["rms_eps"]
    c.ssm_n_k_heads, c.ssm_n_v_heads = g["ssm_n_k_heads"], g["ssm_n_v_heads"]
    c.ssm_head_k_dim, c.ssm_head_v_dim = g["ssm_head_k_dim"], g["ssm_head_v_dim"]
    c.ssm_conv_kernel = g["ssm_conv_kernel"]
    c.gdn_tiled_heads, c.gdn_interleaved_ba = g["gdn_tiled_heads"], g["gdn_interleaved_ba"]
    c.gdn_sigmoid_gate = g["gdn_sigmoid_gate"]
    c.n_expert, c.n_expert_used = g["n_expert"], g["n_expert_used"]
    c.expert_ff, c.shared_ff = g["expert_ff"], g["shared_ff"]
    c.hc_count, c.hc_rank = g["hc_count"], g["hc_rank"]
    c.indexer_n_heads, c.indexer_head_dim = g["indexer_n_heads"], g["indexer_head_dim"]
    c.indexer_top_k = g["indexer_top_k"]
    c.ple_layer, c.ple_ngram, c.ple_conv_kernel = g["ple_layer"], g["ple_ngram"], g["ple_conv_kernel"]
    c.ple_n_heads, c.ple_head_dim = g["ple_n_heads"], g["ple_head_dim"]
    for flag in g["recurrent"]:
        c.recurrent.push_back(bool(flag))
    for ratio in g["compress_ratios"]:
        c.compress_ratios.push_back(int(ratio))
    return c
