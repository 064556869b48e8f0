# Declarations of the kernels' host round trips (cuda/include/strata/check/kernel_check.hpp).
from libc.stdint cimport int8_t, int32_t, uint8_t, uint32_t
from libcpp.string cimport string

from strata.binding.errors cimport raise_strata_error
from strata.libstrata.check.q8_host cimport Q8Host
from strata.libstrata.device_weights cimport HostTensor
from strata.libstrata.forms cimport FloatKind, QuantForm, QuantPlanes


cdef extern from "strata/check/kernel_check.hpp" nogil:
    void cpp_rms_norm "strata::kernel_check::rms_norm"(int device, const float* x, const float* w, float* y, int rows,
                                                     int cols, float eps, const Q8Host& y_q8) except +raise_strata_error
    void cpp_raise_error "strata::kernel_check::raise_error"(const string& kind) except +raise_strata_error
    void cpp_quantize_q8_32 "strata::kernel_check::quantize_q8_32"(
        int device, const float* x, long n, int8_t* xq, float* dx, int32_t* sums) except +raise_strata_error
    void cpp_gemv_quant "strata::kernel_check::gemv_quant"(
        int device, const QuantForm& form, const QuantPlanes& planes, int rows, int cols, const float* x,
        float* y) except +raise_strata_error
    void cpp_gemv_float "strata::kernel_check::gemv_float"(
        int device, FloatKind kind, const void* w, int rows, int cols, const float* x,
        float* y) except +raise_strata_error
    void cpp_gemv_quant_batch "strata::kernel_check::gemv_quant_batch"(
        int device, const QuantForm& form, const QuantPlanes& stack, int n_matrix, int rows, int cols,
        const int32_t* slots, int count, int x_stride, const float* x, float* y, int split) except +raise_strata_error
    void cpp_gemv_quant_inputs "strata::kernel_check::gemv_quant_inputs"(
        int device, const QuantForm& form, const QuantPlanes& planes, int rows, int cols, int inputs, int x_stride,
        const float* x, float* y, int kernel) except +raise_strata_error
    void cpp_gemv_float_inputs "strata::kernel_check::gemv_float_inputs"(
        int device, FloatKind kind, const void* w, int rows, int cols, int inputs, int x_stride, const float* x,
        float* y) except +raise_strata_error
    void cpp_gemv_float_batch "strata::kernel_check::gemv_float_batch"(
        int device, FloatKind kind, const void* w_stack, int n_matrix, int rows, int cols, const int32_t* slots,
        int count, int x_stride, const float* x, float* y) except +raise_strata_error
    double cpp_time_gemv_quant "strata::kernel_check::time_gemv_quant"(
        int device, const QuantForm& form, const QuantPlanes& planes, int rows, int cols,
        int reps) except +raise_strata_error
    void cpp_time_gemv_quant_inputs "strata::kernel_check::time_gemv_quant_inputs"(
        int device, const QuantForm& form, const QuantPlanes& planes, int rows, int cols, int max_inputs,
        int reps, double* batch_seconds, double* inputs_seconds, int kernel) except +raise_strata_error
    void cpp_time_gemv_float_inputs "strata::kernel_check::time_gemv_float_inputs"(
        int device, FloatKind kind, const void* w, int rows, int cols, int max_inputs, int reps,
        double* batch_seconds, double* inputs_seconds) except +raise_strata_error
    double cpp_time_gemv_quant_batch "strata::kernel_check::time_gemv_quant_batch"(
        int device, const QuantForm& form, const QuantPlanes& stack, int n_matrix, int rows, int cols, int count,
        int split, int reps) except +raise_strata_error
    double cpp_time_gemv_float "strata::kernel_check::time_gemv_float"(
        int device, FloatKind kind, const void* w, int rows, int cols, int reps) except +raise_strata_error
    void cpp_rms_norm_grouped "strata::kernel_check::rms_norm_grouped"(
        int device, const float* x, const float* w, float* y, int rows, int groups, int cols,
        float eps) except +raise_strata_error
    void cpp_rms_norm_gated "strata::kernel_check::rms_norm_gated"(
        int device, const float* x, const float* z, const float* w, float* y, int heads, int head_dim, float eps,
        const string& gate, const Q8Host& y_q8) except +raise_strata_error
    void cpp_l2_norm "strata::kernel_check::l2_norm"(
        int device, const float* x, float* y, int heads, int head_dim, float eps) except +raise_strata_error
    void cpp_rope_neox "strata::kernel_check::rope_neox"(
        int device, const float* x, const int32_t* positions, float* y, int tokens, int heads, int head_dim,
        int rope_dim, double theta) except +raise_strata_error
    void cpp_moe_route "strata::kernel_check::moe_route"(
        int device, const float* logits, int tokens, int n_expert, int k, int32_t* ids,
        float* weights) except +raise_strata_error
    void cpp_shared_expert_gate "strata::kernel_check::shared_expert_gate"(
        int device, const float* w, const float* x, int rows, int n, float* gate) except +raise_strata_error
    void cpp_swiglu "strata::kernel_check::swiglu"(
        int device, const float* g, const float* u, float* h, int n, const Q8Host& h_q8) except +raise_strata_error
    void cpp_moe_combine "strata::kernel_check::moe_combine"(
        int device, const float* routed, const float* shared, const float* gate, float* out, int rows,
        int n) except +raise_strata_error
    void cpp_moe_cached_sum "strata::kernel_check::moe_cached_sum"(
        int device, const float* rows, const int32_t* slots, const float* weights, int tokens, int k, int n,
        bint accumulate, float* out) except +raise_strata_error
    void cpp_moe_weighted_rows "strata::kernel_check::moe_weighted_rows"(
        int device, const float* rows, int n_rows, const int32_t* row_of, const float* weights, int tokens, int k,
        int n, float* out) except +raise_strata_error
    void cpp_gather_rows "strata::kernel_check::gather_rows"(
        int device, const float* src, int src_rows, const int32_t* index, int m, int n,
        float* dst) except +raise_strata_error
    void cpp_cache_slots "strata::kernel_check::cache_slots"(
        int device, const int32_t* slot_of, int n_expert, const int32_t* ids, int count,
        int32_t* slots) except +raise_strata_error
    cdef cppclass RoutePublishOutputs "strata::kernel_check::RoutePublishOutputs":
        float* logits
        int32_t* ids
        float* weights
        int32_t* slots
        float* bell_x
        int32_t* bell_ids
        float* bell_weights
        int32_t* seq
        uint32_t* ticket
    void cpp_route_publish "strata::kernel_check::route_publish"(
        int device, const HostTensor& router, const float* x, int replays, int k, const int32_t* slot_of,
        bint ring, int ring_base, const RoutePublishOutputs& out) except +raise_strata_error
    cdef cppclass HcReadOutputs "strata::kernel_check::HcReadOutputs":
        float* normed
        float* rms
        float* low
        float* x
        float* inj
        Q8Host x_q8
    void cpp_hc_read "strata::kernel_check::hc_read"(
        int device, const float* h, const float* norm, int streams, int n, float eps, const HostTensor& down,
        const HostTensor& up, const HostTensor* inject, const HcReadOutputs& out) except +raise_strata_error
    void cpp_hc_read_fused "strata::kernel_check::hc_read_fused"(
        int device, const float* h, const float* norm, int streams, int n, float eps, const HostTensor& down,
        const HostTensor& up, const HostTensor* inject, const HcReadOutputs& out) except +raise_strata_error
    void cpp_hc_mix "strata::kernel_check::hc_mix"(
        int device, const float* up, const float* normed, float* x, int rows, int streams,
        int n) except +raise_strata_error
    void cpp_hc_write "strata::kernel_check::hc_write"(
        int device, const float* h, const float* inj, int inj_stride, const float* y, float* h_out, int rows,
        int streams, int n) except +raise_strata_error
    void cpp_hc_write_steered "strata::kernel_check::hc_write_steered"(
        int device, const float* h, const float* inj, int inj_stride, const float* y, const float* vectors,
        const uint8_t* row_has, bint per_row, float* h_out, int rows, int streams, int n) except +raise_strata_error
    void cpp_hc_stream_mean "strata::kernel_check::hc_stream_mean"(
        int device, const float* h, float* out, int streams, int n) except +raise_strata_error
    cdef cppclass SampleExtras "strata::kernel_check::SampleExtras":
        const float* bias
        double frequency_penalty, presence_penalty
        int answer_start
        const int32_t* mask
    void cpp_sample_tokens "strata::kernel_check::sample_tokens"(
        int device, const float* logits, int vocab, const int32_t* seen, int n_seen, double temperature,
        int top_k, double top_p, double min_p, double repeat_penalty, const SampleExtras& extras,
        const double* draws, int n_draws, bint graph, bint argmax_path, int32_t* tokens) except +raise_strata_error
