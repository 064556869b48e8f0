# The prompt path's grouping of a chunk's routing (strata::routes_check).
from libc.stdint cimport int32_t
from libcpp.vector cimport vector

from strata.libstrata.check.routes_check cimport ChunkRoutes, cpp_group_routes


def group_routes(ids, int n_expert, list cache_slot_of, int staging_slots, list prefetched, list on_cpu=None) -> dict:
    """The prompt path's grouping of one layer's routing `ids` [tokens, k] (cuda/src/session/experts/chunk_routes.hpp):
    on_cpu: per expert whether the CPU pool computes it. {"row_token", "row_of", "cached_rows", "cached_experts",
    "cpu": (experts, first_row, rows), "fills": [(experts, first_row, rows)], "parts": [(group slots, group
    begins)] of the cache's rows, the CPU's, then each fill's}."""
    cdef const int32_t[:, ::1] view = np.ascontiguousarray(ids, dtype=np.int32)
    cdef vector[int] cache = cache_slot_of
    cdef vector[int] ahead = prefetched
    cdef vector[char] pooled = [1 if flag else 0 for flag in (on_cpu or [])]
    cdef int tokens = view.shape[0], k = view.shape[1]
    cdef const int32_t* first = &view[0, 0] if tokens > 0 and k > 0 else NULL
    cdef ChunkRoutes r
    with nogil:
        r = cpp_group_routes(first, tokens, k, n_expert, cache, pooled, staging_slots, ahead)
    return {"row_token": list(r.row_token), "row_of": list(r.row_of),
            "cached_rows": r.cached_rows, "cached_experts": r.cached_experts,
            "cpu": (list(r.cpu_experts), r.cpu_first, r.cpu_rows),
            "fills": [(list(r.fill_experts[i]), r.fill_first[i], r.fill_rows[i]) for i in range(r.fill_first.size())],
            "parts": [(list(r.part_slots[i]), list(r.part_begins[i])) for i in range(r.part_slots.size())]}
