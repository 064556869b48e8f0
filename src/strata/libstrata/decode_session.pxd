# Declarations of the decode session (cuda/include/strata/decode_session.hpp).
from libc.stdint cimport int32_t, uint8_t
from libcpp cimport bool as cbool
from libcpp.string cimport string
from libcpp.vector cimport vector

from strata.binding.errors cimport raise_strata_error
from strata.libstrata.device_weights cimport CppDeviceWeights
from strata.libstrata.expert_cache cimport CppExpertCache
from strata.libstrata.expert_pool cimport CppExpertPool
from strata.libstrata.expert_staging cimport CppExpertStaging
from strata.libstrata.geometry cimport ModelGeometry
from strata.libstrata.kv_format cimport KvStorage
from strata.libstrata.ple_gather cimport CppPleGather


cdef extern from "strata/decode_session.hpp" nogil:
    cdef enum class DecodeMode "strata::DecodeMode":
        kUncaptured
        kLayerGraphs
        kTokenGraph

    cdef cppclass DecodeOptions "strata::DecodeOptions":
        int device
        int context
        KvStorage kv
        DecodeMode mode
        double timeout_seconds
        int snapshots
        int prompt_chunk
        cbool prompt_cpu
        cbool kv_streaming
        int defer_experts
        int verify_rows

    const int kMaxVerifyRows "strata::kMaxVerifyRows"
    const int kMaxStepRows "strata::kMaxStepRows"

    cdef cppclass TokenLogprobs "strata::TokenLogprobs":
        double token
        vector[int] ids
        vector[double] values

    cdef cppclass SamplingValues "strata::SamplingValues":
        double temperature, top_p, min_p
        float repeat_penalty
        int top_k
        double frequency_penalty, presence_penalty
        int answer_start
        const int* bias_ids
        const float* bias_values
        int n_bias
        cbool token_mask
        unsigned mask_ticket

    # A struct, so Cython converts it to a dict keyed by the C++ field names.
    cdef struct DecodeStats "strata::DecodeStats":
        long tokens
        double seconds, ring_wait_seconds, pool_seconds
        long rings
        double gpu_pre_seconds, gpu_post_seconds
        vector[long] expert_hits, expert_misses, expert_copies
        long expert_copy_bytes
        long prompt_tokens, prompt_chunks
        double prompt_seconds
        long prompt_staged_experts, prompt_cached_experts, prompt_pooled_experts, prompt_staged_bytes
        long kv_stream_bytes
        double ple_seconds
        long batch_tokens
        double batch_seconds
        long batch_steps
        long batch_graphs

    int cpp_prompt_prefetch_rows "strata::prompt_prefetch_rows"(const ModelGeometry& geometry)
    size_t cpp_decode_scratch_bytes "strata::decode_scratch_bytes"(
        const ModelGeometry& geometry, int context, size_t sampler_bytes) except +raise_strata_error
    size_t cpp_prompt_scratch_bytes "strata::prompt_scratch_bytes"(
        const ModelGeometry& geometry, int chunk, int context, KvStorage kv,
        cbool kv_streaming) except +raise_strata_error
    size_t cpp_sampler_workspace_bytes "strata::sampler_workspace_bytes"(int n_vocab) except +raise_strata_error

    cdef cppclass StepPart "strata::DecodeSession::StepPart":
        const int* tokens
        int count
        const float* ple_rows
        cbool verify
        float* logits
        cbool sample
        SamplingValues sampling
        double u
        int sampled

    cdef cppclass CppDecodeSession "strata::DecodeSession":
        CppDecodeSession(const CppDeviceWeights& weights, CppExpertPool& pool, const ModelGeometry& geometry,
                         const DecodeOptions& options, CppExpertCache* cache,
                         CppExpertStaging* staging, CppPleGather* ple) except +raise_strata_error
        int step(int token, const float* ple_rows, const SamplingValues& sampling, double u,
                 cbool sample) except +raise_strata_error
        int feed(const int* tokens, int n, const float* ple_rows, const SamplingValues& sampling, double u,
                 cbool sample, float* all_logits) except +raise_strata_error
        void verify(const int* tokens, int n, const float* ple_rows, float* all_logits) except +raise_strata_error
        void truncate(int position) except +raise_strata_error
        @staticmethod
        void step_batch(CppDecodeSession* const* sessions, int n, const int* tokens, const float* const* ple_rows,
                        const SamplingValues* sampling, const double* u, cbool sample,
                        int* out) except +raise_strata_error
        @staticmethod
        void step_rows(CppDecodeSession* const* sessions, StepPart* parts, int n) except +raise_strata_error
        int verify_rows()
        void set_control_vectors(const float* table, const uint8_t* layers) except +raise_strata_error
        vector[int] control_vector_layers()
        void layer_states(const int* tokens, int n, const float* ple_rows, float* out) except +raise_strata_error
        void logits(float* out) except +raise_strata_error
        void reset() except +raise_strata_error
        TokenLogprobs logprobs(int token, int n, cbool token_mask) except +raise_strata_error
        int32_t* token_mask_words()
        int token_mask_size()
        void publish_token_mask(unsigned ticket)
        void check_token_mask() except +raise_strata_error
        void snapshot(int slot) except +raise_strata_error
        void restore(int slot) except +raise_strata_error
        string batch_key() except +raise_strata_error
        int position()
        int context()
        int prompt_chunk()
        DecodeMode mode()
        cbool captured()
        const DecodeStats& stats() except +raise_strata_error
