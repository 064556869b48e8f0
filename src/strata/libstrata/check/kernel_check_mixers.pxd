# Declarations of the decode-step mixer and plumbing round trips
# (cuda/include/strata/check/kernel_check_mixers.hpp).
from libc.stdint cimport uint16_t
from libcpp cimport bool

from strata.binding.errors cimport raise_strata_error
from strata.libstrata.check.q8_host cimport Q8Host
from strata.libstrata.kv_format cimport KvStorage


cdef extern from "strata/check/kernel_check_mixers.hpp" namespace "strata::kernel_check" nogil:
    cdef cppclass GdnCheckShape "strata::kernel_check::GdnCheckShape":
        int n_k_heads, n_v_heads, head_k_dim, head_v_dim, conv_kernel
        bool tiled_heads, interleaved_ba, sigmoid_gate
        float eps
    cdef cppclass AttentionCheckShape "strata::kernel_check::AttentionCheckShape":
        int n_head, n_head_kv, head_dim, rope_dim, page_size
        KvStorage kv
        float eps
    cdef cppclass QsaCheckInputs "strata::kernel_check::QsaCheckInputs":
        int n_heads, head_dim, keep_blocks, ratio
        const float* q
        const float* kraw
        const float* q_norm
        const float* k_norm
    cdef cppclass QsaCheckOutputs "strata::kernel_check::QsaCheckOutputs":
        float* scores
        int* selected
        int* n_selected
    cdef cppclass AttentionTimingShape "strata::kernel_check::AttentionTimingShape":
        int n_head, n_head_kv, head_dim, page_size
        KvStorage kv
        int context, keep_blocks, ratio
    cdef cppclass IndexerTimingShape "strata::kernel_check::IndexerTimingShape":
        int n_heads, head_dim, ratio, keep_blocks, context
    cdef cppclass DoorbellCheckResult "strata::kernel_check::DoorbellCheckResult":
        int status
        int seq_seen

    void cpp_gdn_steps "strata::kernel_check::gdn_steps"(
        int device, const GdnCheckShape& shape, int steps, const float* qkv, const float* z,
        const float* beta_in, const float* alpha_in, const float* conv_weight, const float* ssm_a,
        const float* dt_bias, const float* norm_weight, float* conv_state, float* state, float* out,
        const Q8Host& out_q8) except +raise_strata_error
    void cpp_gdn_chunk "strata::kernel_check::gdn_chunk"(
        int device, const GdnCheckShape& shape, int tokens, int row_pad, const float* qkv, const float* z,
        const float* beta_in, const float* alpha_in, const float* conv_weight, const float* ssm_a,
        const float* dt_bias, const float* norm_weight, float* conv_state, float* state, float* conv_out,
        float* out, float* state_rows, float* conv_rows) except +raise_strata_error
    void cpp_attention_steps "strata::kernel_check::attention_steps"(
        int device, const AttentionCheckShape& shape, int steps, const float* q_gate, const float* k,
        const float* v, const float* q_norm, const float* k_norm, const float* rope_cos, const float* rope_sin,
        const int* page_order, int n_pages, const QsaCheckInputs& qsa, const QsaCheckOutputs& qsa_out,
        float* out, float* q_out, float* k_cache, float* v_cache, const Q8Host& out_q8) except +raise_strata_error
    void cpp_kv_rotate_rows "strata::kernel_check::kv_rotate_rows"(
        int device, int rows, int head_dim, const float* x, float* out) except +raise_strata_error
    int cpp_qsa_top_blocks "strata::kernel_check::qsa_top_blocks"(
        int device, const float* scores, int n_blocks, int keep_blocks, int* selected) except +raise_strata_error
    double cpp_time_attention_decode "strata::kernel_check::time_attention_decode"(
        int device, const AttentionTimingShape& shape, int reps) except +raise_strata_error
    double cpp_time_qsa_select "strata::kernel_check::time_qsa_select"(
        int device, const IndexerTimingShape& shape, bool top_only, int reps) except +raise_strata_error
    void cpp_embed_rows "strata::kernel_check::embed_rows"(
        int device, int kind, int rows, int cols, const void* data, const uint16_t* d, const int* ids,
        int n_ids, float* out) except +raise_strata_error
    void cpp_ple_steps "strata::kernel_check::ple_steps"(
        int device, int streams, int width, int dilation, int conv_kernel, float eps, int steps, bool chunk,
        const float* stream_rows, const float* key, const float* value, const float* norm_key,
        const float* norm_query, const float* norm_conv, const float* conv_weight, float* history,
        float* out, float* history_rows) except +raise_strata_error
    DoorbellCheckResult cpp_doorbell_round_trip "strata::kernel_check::doorbell_round_trip"(
        int device, int n, int k, const float* x, const int* ids, const float* weights, int ring_base,
        int ring_offset, bool answer, const float* answer_row, long long timeout_ns, float* published_x,
        int* published_ids, float* published_weights, float* answered) except +raise_strata_error
