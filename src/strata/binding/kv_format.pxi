# The KV cache's storage formats (strata/kv_format.hpp): a strata.KV as the core's KvStorage.
from strata.libstrata.kv_format cimport KvStorage

_KV_STORAGE = {KV.BF16: KvStorage.Bf16, KV.INT8: KvStorage.Int8, KV.K8V4: KvStorage.K8V4, KV.Q4: KvStorage.Q4}


cdef KvStorage kv_storage(object kv) except *:
    return _KV_STORAGE[KV.parse(kv)]  # every strata.KV has its storage; KV.parse names the choices
