# Routed experts held in VRAM (strata/expert_cache.hpp).
from libcpp.vector cimport vector

from strata.libstrata.expert_cache cimport cpp_expert_cache_bytes
from strata.libstrata.expert_policy cimport PolicyOptions


cdef class ExpertCache:
    """Routed experts held in VRAM (strata/expert_cache.hpp): `slots[l]` of layer l's experts, copied from the
    pool's host weights by hold(), and with policy {"replace": True, ...} replaced as routing moves. Keeps
    `pool` and `host_weights` (the arrays the pool's planes point into: strata.runtime.pool.ExpertPool
    .host_weights()) alive while it lives: replacement copies from them, and pins their pages until the cache
    is gone."""

    def __cinit__(self, CpuExpertPool pool, list slots, int device=0, dict policy=None, *, host_weights):
        cdef vector[int] counts = slots
        cdef CppExpertPool* native_pool = pool.native()
        cdef PolicyOptions options = policy_options(policy or {})
        self.pool, self.host_weights = pool, host_weights
        with nogil:
            self.cache.reset(new CppExpertCache(device, native_pool[0], counts, options))

    def __dealloc__(self):
        with nogil:
            self.cache.reset()

    @staticmethod
    def bytes_for(CpuExpertPool pool, list slots) -> int:
        """Bytes a cache of `slots` per layer would allocate for `pool`'s layers."""
        cdef vector[int] counts = slots
        return cpp_expert_cache_bytes(pool.native()[0], counts)

    def hold(self, int layer, experts) -> None:
        """Copy `experts` (distinct ids, at most the layer's slots) into layer `layer`'s slots, in order."""
        cdef vector[int] ids = [int(e) for e in experts]
        with nogil:
            self.cache.get().hold(layer, ids)

    def held(self, int layer) -> list:
        """The expert in each slot of `layer` (-1: empty)."""
        return list(self.cache.get().held(layer))

    def slots(self, int layer) -> int:
        return self.cache.get().slots(layer)

    def holds(self, int layer, int expert) -> bool:
        return self.cache.get().holds(layer, expert)

    def holds_all(self, int layer) -> bool:
        return self.cache.get().holds_all(layer)

    @property
    def layers(self) -> int:
        return self.cache.get().layers()

    @property
    def bytes(self) -> int:
        return self.cache.get().bytes()

    @property
    def device(self) -> int:
        return self.cache.get().device()
