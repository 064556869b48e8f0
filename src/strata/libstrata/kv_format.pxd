# Declarations of the KV cache's storage formats (cuda/include/strata/kv_format.hpp).


cdef extern from "strata/kv_format.hpp" nogil:
    cdef enum class KvStorage "strata::KvStorage":
        Bf16
        Int8
        Q4
        K8V4
