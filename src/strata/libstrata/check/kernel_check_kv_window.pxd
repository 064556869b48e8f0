# Declarations of the KV streaming window round trip (cuda/include/strata/check/kernel_check_kv_window.hpp).
from strata.binding.errors cimport raise_strata_error
from strata.libstrata.kv_format cimport KvStorage


cdef extern from "strata/check/kernel_check_kv_window.hpp" namespace "strata::kernel_check" nogil:
    cdef cppclass KvWindowCheckShape "strata::kernel_check::KvWindowCheckShape":
        int n_head_kv, head_dim, ratio, keep_blocks, slots, context, n_head
        KvStorage kv
    cdef cppclass KvWindowCheckSizes "strata::kernel_check::KvWindowCheckSizes":
        size_t host_keys, host_values, window_keys, window_values, key_row, value_row, region, slot
    cdef cppclass KvWindowCheckTokens "strata::kernel_check::KvWindowCheckTokens":
        int count
        const int* positions
        const int* selected
        const int* n_selected
        const unsigned char* resets
        const unsigned char* key_rows
        const unsigned char* value_rows
        const float* q
        const float* q_gate
    cdef cppclass KvWindowCheckOutputs "strata::kernel_check::KvWindowCheckOutputs":
        int* slot_of
        int* owner
        int* stamps
        unsigned long long* fetched
        unsigned char* window_keys
        unsigned char* window_values
        unsigned char* host_keys
        unsigned char* host_values
        float* out_window
        float* out_whole
        int* reset_slot_of
        int* reset_owner
        int* reset_stamps
        unsigned long long* reset_fetched

    KvWindowCheckSizes cpp_kv_window_check_sizes "strata::kernel_check::kv_window_check_sizes"(
        const KvWindowCheckShape& shape) except +raise_strata_error
    void cpp_kv_window_steps "strata::kernel_check::kv_window_steps"(
        int device, const KvWindowCheckShape& shape, const unsigned char* host_keys,
        const unsigned char* host_values, const KvWindowCheckTokens& tokens,
        const KvWindowCheckOutputs& out) except +raise_strata_error
