# Declarations of the chunk attention round trip (cuda/include/strata/check/kernel_check_attention_chunk.hpp).
from libcpp cimport bool

from strata.binding.errors cimport raise_strata_error
from strata.libstrata.check.kernel_check_mixers cimport AttentionCheckShape, QsaCheckInputs


cdef extern from "strata/check/kernel_check_attention_chunk.hpp" namespace "strata::kernel_check" nogil:
    cdef cppclass ChunkCheckOutputs "strata::kernel_check::ChunkCheckOutputs":
        float* out
        float* q
        unsigned char* k_bytes
        unsigned char* v_bytes
        float* k_cache
        float* v_cache
        float* raw_keys
        float* block_keys
        int* selected
        int* n_selected

    size_t cpp_attention_chunk_scratch "strata::kernel_check::attention_chunk_scratch"(
        const AttentionCheckShape& shape, int chunk)
    int cpp_attention_chunk_spans "strata::kernel_check::attention_chunk_spans"(
        const AttentionCheckShape& shape, int chunk, bool gathered)
    size_t cpp_chunk_cache_bytes "strata::kernel_check::chunk_cache_bytes"(
        const AttentionCheckShape& shape, int n_pages, bool values)
    void cpp_attention_chunk_vs_decode "strata::kernel_check::attention_chunk_vs_decode"(
        int device, const AttentionCheckShape& shape, int start, int chunk, bool gathered, const float* q_gate,
        const float* k, const float* v, const float* q_norm, const float* k_norm, const float* rope_cos,
        const float* rope_sin, const int* page_order, int n_pages, const QsaCheckInputs& qsa,
        const ChunkCheckOutputs& stepwise, const ChunkCheckOutputs& at_once) except +raise_strata_error
