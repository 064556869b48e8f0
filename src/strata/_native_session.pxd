# Declarations of the model geometry, the session layout and arena, the expert cache and the decode session
# (cuda/include/strata/geometry.hpp, kv_format.hpp, session_layout.hpp, session_arena.hpp, expert_cache.hpp,
# decode_session.hpp).
from libc.stdint cimport int32_t
from libcpp cimport bool as cbool
from libcpp.string cimport string
from libcpp.vector cimport vector

from strata._native_errors cimport raise_strata_error
from strata._native_ple cimport CppPleGather
from strata._native_pool cimport CppExpertPool
from strata._native_weights cimport CppDeviceWeights


cdef extern from "strata/geometry.hpp" nogil:
    cdef cppclass ModelGeometry "strata::ModelGeometry":
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


cdef extern from "strata/kv_format.hpp" nogil:
    cdef enum class KvStorage "strata::KvStorage":
        Bf16
        Int8
        Q4
        K8V4


cdef extern from "strata/session_layout.hpp" nogil:

    cdef enum class Place "strata::Place":
        Device
        Host

    cdef cppclass LayoutRegion "strata::Region":
        string name
        int layer
        size_t offset
        size_t bytes
        Place place

    cdef cppclass SessionLayout "strata::SessionLayout":
        int kv_pages
        int snapshots
        cbool kv_streaming
        int window_slots
        size_t state_bytes
        vector[LayoutRegion] regions
        size_t total
        size_t host_total

    const int kKvPageTokens "strata::kKvPageTokens"
    const int kMaxSnapshots "strata::kMaxSnapshots"
    SessionLayout cpp_plan_session "strata::plan_session"(
        const ModelGeometry& geometry, int context, KvStorage kv, int snapshots,
        cbool kv_streaming) except +raise_strata_error


cdef extern from "strata/session_arena.hpp" nogil:
    cdef cppclass CppSessionArena "strata::SessionArena":
        CppSessionArena(int device, SessionLayout layout) except +raise_strata_error
        void reset() except +raise_strata_error
        void snapshot(int slot) except +raise_strata_error
        void restore(int slot) except +raise_strata_error
        const SessionLayout& layout()


cdef extern from "strata/expert_policy.hpp" nogil:
    cdef cppclass PolicyOptions "strata::PolicyOptions":
        cbool replace
        int admit_after, window, max_copies

    cdef cppclass ExpertMove "strata::ExpertMove":
        int layer, slot, expert, evicted

    cdef cppclass CppReplacementPolicy "strata::ReplacementPolicy":
        CppReplacementPolicy(const vector[int]& slots, int n_expert,
                             const PolicyOptions& options) except +raise_strata_error
        void hold(int layer, const vector[int]& experts) except +raise_strata_error
        int note(int layer, const int32_t* ids, int k) except +raise_strata_error
        vector[ExpertMove] plan() except +raise_strata_error
        void complete(const ExpertMove& move) except +raise_strata_error
        int slot_of(int layer, int expert) except +raise_strata_error


cdef extern from "strata/expert_cache.hpp" nogil:
    cdef cppclass CppExpertCache "strata::ExpertCache":
        CppExpertCache(int device, const CppExpertPool& pool, const vector[int]& slots,
                       const PolicyOptions& policy) except +raise_strata_error
        void hold(int layer, const vector[int]& experts) except +raise_strata_error
        int layers()
        int slots(int layer) except +raise_strata_error
        cbool holds(int layer, int expert)
        cbool holds_all(int layer)
        vector[int] held(int layer) except +raise_strata_error
        size_t bytes()
        int device()
    size_t cpp_expert_cache_bytes "strata::ExpertCache::bytes_for"(
        const CppExpertPool& pool, const vector[int]& slots) except +raise_strata_error


cdef extern from "strata/expert_staging.hpp" nogil:
    cdef cppclass CppExpertStaging "strata::ExpertStaging":
        CppExpertStaging(int device, const CppExpertPool& pool, int slots) except +raise_strata_error
        int slots()
        int n_expert()
        size_t bytes()
        int device()
    size_t cpp_expert_staging_bytes "strata::ExpertStaging::bytes_for"(
        const CppExpertPool& pool, int slots) except +raise_strata_error


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

    cdef cppclass TokenLogprobs "strata::TokenLogprobs":
        double token
        vector[int] ids
        vector[double] values

    cdef cppclass SamplingValues "strata::SamplingValues":
        double temperature, top_p, min_p
        float repeat_penalty
        int top_k

    cdef cppclass DecodeStats "strata::DecodeStats":
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

    size_t cpp_decode_scratch_bytes "strata::decode_scratch_bytes"(
        const ModelGeometry& geometry, int context, size_t sampler_bytes) except +raise_strata_error
    size_t cpp_prompt_scratch_bytes "strata::prompt_scratch_bytes"(
        const ModelGeometry& geometry, int chunk, int context, KvStorage kv,
        cbool kv_streaming) except +raise_strata_error
    size_t cpp_sampler_workspace_bytes "strata::sampler_workspace_bytes"(int n_vocab) except +raise_strata_error

    cdef cppclass CppDecodeSession "strata::DecodeSession":
        CppDecodeSession(const CppDeviceWeights& weights, CppExpertPool& pool, const ModelGeometry& geometry,
                         const DecodeOptions& options, CppExpertCache* cache,
                         CppExpertStaging* staging, CppPleGather* ple) except +raise_strata_error
        int step(int token, const float* ple_rows, const SamplingValues& sampling, double u,
                 cbool sample) except +raise_strata_error
        int feed(const int* tokens, int n, const float* ple_rows, const SamplingValues& sampling, double u,
                 cbool sample, float* all_logits) except +raise_strata_error
        void logits(float* out) except +raise_strata_error
        void reset() except +raise_strata_error
        TokenLogprobs logprobs(int token, int n) except +raise_strata_error
        void snapshot(int slot) except +raise_strata_error
        void restore(int slot) except +raise_strata_error
        int position()
        int context()
        int prompt_chunk()
        DecodeMode mode()
        cbool captured()
        const DecodeStats& stats() except +raise_strata_error
