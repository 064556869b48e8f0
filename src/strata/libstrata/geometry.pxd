# Declarations of the model geometry the core reads (cuda/include/strata/geometry.hpp). A struct, so Cython
# converts it from a dict of its fields and to one: the field names here are the C++ names.
from libcpp cimport bool as cbool
from libcpp.vector cimport vector


cdef extern from "strata/geometry.hpp" nogil:
    cdef struct ModelGeometry "strata::ModelGeometry":
        int n_layer, n_embd, n_vocab
        vector[cbool] recurrent
        int n_head, n_head_kv, head_dim, rope_dim
        double rope_theta
        float rms_eps
        int ssm_n_k_heads, ssm_n_v_heads, ssm_head_k_dim, ssm_head_v_dim, ssm_conv_kernel
        cbool gdn_tiled_heads, gdn_interleaved_ba, gdn_sigmoid_gate
        int n_expert, n_expert_used, expert_ff, shared_ff
        int hc_count, hc_rank
        int indexer_n_heads, indexer_head_dim, indexer_top_k
        vector[int] compress_ratios
        int ple_layer, ple_ngram, ple_conv_kernel, ple_n_heads, ple_head_dim
