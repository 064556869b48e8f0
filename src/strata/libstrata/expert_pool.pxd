# Declarations of the CPU expert pool (cuda/include/strata/expert_pool.hpp). The form descriptor is the
# kernels' (strata/forms.hpp).
from libc.stdint cimport int32_t, int64_t, uint8_t
from libcpp cimport bool
from libcpp.string cimport string
from libcpp.vector cimport vector

from strata.binding.errors cimport raise_strata_error
from strata.libstrata.expert_tiers cimport FileMatrix, TierLayerStats, TierPolicy
from strata.libstrata.forms cimport FloatKind, QuantForm


cdef extern from "strata/expert_pool.hpp" namespace "strata::cpu" nogil:
    cdef enum class Isa "strata::cpu::Isa":
        kAuto
        kAvx2
        kAvx512
    bool cpp_cpu_has_avx2 "strata::cpu::cpu_has_avx2"()
    bool cpp_cpu_has_avx512_vnni "strata::cpu::cpu_has_avx512_vnni"()

    cdef cppclass Plane "strata::cpu::Plane":
        const void* data
        int64_t nbytes

    cdef cppclass ExpertMatrix "strata::cpu::ExpertMatrix":
        bint is_float
        FloatKind float_kind
        QuantForm form
        int64_t n_expert
        int64_t rows
        int64_t cols
        Plane codes
        Plane d
        Plane sub_scales
        Plane mins
        Plane sub_mins

    cdef cppclass PoolOptions "strata::cpu::PoolOptions":
        int threads
        bool smt
        bool pin_caller
        Isa isa
        int spin_us
        int max_rows

    cdef cppclass ExpertFileOptions "strata::cpu::ExpertFileOptions":
        bool direct
        int io_threads
        int staging_slots

    cdef cppclass ExpertFileInfo "strata::cpu::ExpertFileInfo":
        string path
        bool direct
        string buffered_reason
        int io_threads, staging_slots
        int64_t staging_bytes
        bool staging_locked
        int64_t arena_bytes
        bool arenas_locked
        int64_t bytes_read

    cdef cppclass TierSizes "strata::cpu::TierSizes":
        int64_t slot_bytes, bounce_bytes

    cdef cppclass CppExpertPool "strata::cpu::ExpertPool":
        CppExpertPool(int64_t n_embd, int64_t expert_ff, int max_k,
                      const PoolOptions& options) except +raise_strata_error
        void set_layer(int layer, const ExpertMatrix& gate, const ExpertMatrix& up,
                       const ExpertMatrix& down) except +raise_strata_error
        void run_layer(int layer, const float* x, const int32_t* ids, const float* weights, const uint8_t* skip,
                       int k, float* out) except +raise_strata_error
        void run_layer_sum(int layer, const float* x, const int32_t* ids, const float* weights,
                           const uint8_t* skip, int k, float* out) except +raise_strata_error
        void run_groups(int layer, const float* x, const int32_t* experts, const int* begin, int groups,
                        float* out) except +raise_strata_error
        void run_rows_sum(int layer, const float* x, const int32_t* ids, const float* weights, const uint8_t* skip,
                          int rows, int k, float* out) except +raise_strata_error
        void open_expert_file(const string& path, const ExpertFileOptions& options) except +raise_strata_error
        void set_tiered_layer(int layer, const ExpertMatrix& gate, const ExpertMatrix& up, const ExpertMatrix& down,
                              const FileMatrix& gate_file, const FileMatrix& up_file, const FileMatrix& down_file,
                              int slots, const vector[int]& hold, const TierPolicy& policy) except +raise_strata_error
        @staticmethod
        TierSizes tier_sizes(int layer, const ExpertMatrix& gate, const ExpertMatrix& up, const ExpertMatrix& down,
                             const FileMatrix& gate_file, const FileMatrix& up_file,
                             const FileMatrix& down_file) except +raise_strata_error
        bool is_tiered(int layer)
        vector[TierLayerStats] tier_stats() except +raise_strata_error
        ExpertFileInfo expert_file_info() except +raise_strata_error
        int64_t expert_bytes(int layer) except +raise_strata_error
        void read_expert(int layer, int expert, uint8_t* out) except +raise_strata_error
        double read_bandwidth(int64_t nbytes, int reps) except +raise_strata_error
        void close()
        int threads()
        int participants()
        Isa isa()
        vector[vector[int]] worker_cpus()
        vector[int] caller_cpus()
        int parked_workers()
