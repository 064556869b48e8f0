# The prompt path's VRAM staging for routed experts (strata/expert_staging.hpp).
from strata.libstrata.expert_staging cimport cpp_expert_staging_bytes


cdef class ExpertStaging:
    """The prompt path's VRAM staging for routed experts (strata/expert_staging.hpp): two buffers of `slots`
    experts each, refilled per chunk from the pool's host weights, whose pages it locks while it lives. Keeps
    `pool` and `host_weights` (strata.runtime.pool.ExpertPool.host_weights()) alive."""

    def __cinit__(self, CpuExpertPool pool, int slots, int device=0, *, host_weights):
        cdef CppExpertPool* native_pool = pool.native()
        self.pool, self.host_weights = pool, host_weights
        with nogil:
            self.staging.reset(new CppExpertStaging(device, native_pool[0], slots))

    def __dealloc__(self):
        with nogil:
            self.staging.reset()

    @staticmethod
    def bytes_for(CpuExpertPool pool, int slots) -> int:
        """Bytes a staging of `slots` experts per buffer would allocate for `pool`'s layers."""
        return cpp_expert_staging_bytes(pool.native()[0], slots)

    @property
    def slots(self) -> int:
        return self.staging.get().slots()

    @property
    def bytes(self) -> int:
        return self.staging.get().bytes()

    @property
    def device(self) -> int:
        return self.staging.get().device()
