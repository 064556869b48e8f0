# The extension types and C-level helpers of strata._native that other modules cimport (the test hooks'
# strata._native_check takes the production objects and converts arguments the same way). Definitions live
# in _native.pyx's binding/<header>.pxi files.
from libc.stdint cimport int32_t, uint8_t
from libcpp.memory cimport unique_ptr

from strata.libstrata.decode_session cimport CppDecodeSession, DecodeMode
from strata.libstrata.device_weights cimport CppDeviceWeights, HostTensor
from strata.libstrata.expert_cache cimport CppExpertCache
from strata.libstrata.expert_pool cimport CppExpertPool, ExpertMatrix, Isa
from strata.libstrata.expert_staging cimport CppExpertStaging
from strata.libstrata.file_rows cimport CppFileRows
from strata.libstrata.forms cimport FloatKind, QuantForm, QuantPlanes
from strata.libstrata.geometry cimport ModelGeometry
from strata.libstrata.kv_format cimport KvStorage
from strata.libstrata.ple_gather cimport CppPleGather
from strata.libstrata.session_layout cimport SessionLayout


cdef class CpuExpertPool:
    cdef unique_ptr[CppExpertPool] pool
    cdef readonly long n_embd
    cdef readonly long expert_ff
    cdef readonly int max_k
    cdef readonly int max_rows
    cdef CppExpertPool* native(self) except NULL
    cdef int checked_request(self, str what, const float[::1] x, const int32_t[::1] ids, const float[::1] weights,
                             const uint8_t[::1] skip) except -1


cdef class DeviceWeights:
    cdef unique_ptr[CppDeviceWeights] weights


cdef class ExpertCache:
    cdef unique_ptr[CppExpertCache] cache
    cdef readonly object pool, host_weights


cdef class ExpertStaging:
    cdef unique_ptr[CppExpertStaging] staging
    cdef readonly object pool, host_weights


cdef class FileRows:
    cdef unique_ptr[CppFileRows] rows


cdef class PleGather:
    cdef unique_ptr[CppPleGather] gather
    cdef readonly FileRows table
    cdef readonly int n_heads, head_dim


cdef class DecodeSession:
    cdef unique_ptr[CppDecodeSession] session
    cdef readonly object weights, pool, cache, staging, ple
    cdef readonly int n_vocab, ple_width, n_layer, n_embd
    cdef object held_rows
    cdef object verified  # verified_rows(): made on first use
    cdef object mask_words  # token_mask_words(): made on first use
    cdef const float* rows_of(self, ple_rows, int n) except? NULL
    cdef float* logits_of(self, logits, int n) except NULL
    cdef object verify_out(self, logits, int n)
    cdef CppDecodeSession* native(self) except NULL


cdef QuantForm quant_form(object form) except *
cdef QuantPlanes quant_planes(object weight, list keep) except *
cdef FloatKind float_kind(object weight) except *
cdef HostTensor host_tensor(str name, object held, list keep) except *
cdef Isa pool_isa(str isa) except *
cdef ExpertMatrix expert_matrix(dict spec) except *
cdef ModelGeometry model_geometry(dict geometry) except *
cdef KvStorage kv_storage(object kv) except *
cdef DecodeMode decode_mode(object mode) except *
cdef dict layout_dict(SessionLayout layout)
