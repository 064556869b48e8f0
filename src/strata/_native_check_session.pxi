# Test hooks over the session's pieces (strata::exchange_check, weights_check, arena_check, routes_check): the
# GPU <-> CPU expert exchange through the session's own token schedule, GEMVs over uploaded weights, a session
# arena whose bytes tests can poison and read back, the prompt path's grouping of a chunk's routing.
from libc.stdint cimport int32_t, uint64_t
from libcpp.memory cimport unique_ptr
from libcpp.string cimport string
from libcpp.vector cimport vector

from strata._native cimport CpuExpertPool, DeviceWeights, decode_mode, kv_storage, layout_dict, model_geometry
from strata._native_check_session cimport (
    ChunkRoutes, ExchangeFaults, ExchangeTiming, cpp_arena_download, cpp_arena_fill, cpp_exchange_run,
    cpp_group_routes, cpp_weights_gemv,
)
from strata._native_session cimport (
    CppSessionArena, DecodeMode, KvStorage, ModelGeometry, SessionLayout, cpp_plan_session,
)
from strata._native_pool cimport CppExpertPool
from strata._native_weights cimport DeviceTensor


def expert_exchange(CpuExpertPool pool, mode, x, ids, weights, int tokens, *, int device=0,
                    int never_ring_layer=-1, int never_answer_layer=-1, double timeout=2.0,
                    uint64_t first_token=0):
    """Run `tokens` tokens of the per-layer GPU <-> CPU expert exchange in `mode` (a strata.Mode).

    x: float32 [n_layer, n]; ids: int32 [n_layer, k]; weights: float32 [n_layer, k]. For token t the GPU
    publishes x[l] * (t + 1). `first_token` is the session-lifetime index the first token gets (its ring
    numbers follow from it). Returns (out float32 [tokens, n_layer, n], timing dict).
    """
    cdef DecodeMode cmode = decode_mode(mode)
    cdef const float[:, ::1] xv = np.ascontiguousarray(x, dtype=np.float32)
    cdef const int32_t[:, ::1] iv = np.ascontiguousarray(ids, dtype=np.int32)
    cdef const float[:, ::1] wv = np.ascontiguousarray(weights, dtype=np.float32)
    cdef int n_layer = xv.shape[0], n = xv.shape[1], k = iv.shape[1]
    if iv.shape[0] != n_layer or wv.shape[0] != n_layer or wv.shape[1] != k:
        raise InvalidArgument(f"ids {iv.shape[0]}x{iv.shape[1]} and weights {wv.shape[0]}x{wv.shape[1]} must "
                              f"both be n_layer x k = {n_layer}x{k}")
    if tokens < 1:
        raise InvalidArgument(f"tokens must be >= 1, got {tokens}")
    out = np.full((tokens, n_layer, n), np.nan, dtype=np.float32)
    cdef float[:, :, ::1] ov = out
    cdef ExchangeFaults faults
    faults.never_ring_layer = never_ring_layer
    faults.never_answer_layer = never_answer_layer
    faults.first_token = first_token
    cdef CppExpertPool* native_pool = pool.native()
    cdef ExchangeTiming timing
    with nogil:
        timing = cpp_exchange_run(native_pool[0], device, cmode, n_layer, n, k, &xv[0, 0], &iv[0, 0], &wv[0, 0],
                                  tokens, &ov[0, 0, 0], faults, timeout)
    return out, {"seconds_per_token": timing.seconds_per_token, "ring_wait_seconds": timing.ring_wait_seconds,
                 "pool_seconds": timing.pool_seconds, "rings": timing.rings}


def weights_gemv(DeviceWeights weights, str name, x):
    """W x for the uploaded tensor `name` through the decode-step GEMV kernels (quantized forms take x as q8_32)."""
    cdef string key = name.encode()
    cdef const DeviceTensor* t = &weights.weights.get().get(key)
    cdef const float[::1] xv = np.ascontiguousarray(x, dtype=np.float32)
    if xv.shape[0] != t.cols:
        raise InvalidArgument(f"gemv of {name}: x has {xv.shape[0]} entries, the tensor has {t.cols} columns")
    out = np.empty(t.rows, np.float32)
    cdef float[::1] ov = out
    with nogil:
        cpp_weights_gemv(weights.weights.get()[0], key, &xv[0], &ov[0])
    return out


cdef class SessionArena:
    """One session's sequence state in VRAM (strata/session_arena.hpp), laid out for `geometry` (as
    strata.runtime.geometry.native_geometry writes it), `context` tokens and `kv`, with or without KV streaming."""
    cdef unique_ptr[CppSessionArena] arena

    def __cinit__(self, dict geometry, int context, kv, int device=0, int snapshots=0, bint kv_streaming=False):
        cdef ModelGeometry g = model_geometry(geometry)
        cdef KvStorage storage = kv_storage(kv)
        cdef SessionLayout layout
        with nogil:
            layout = cpp_plan_session(g, context, storage, snapshots, kv_streaming)
            self.arena.reset(new CppSessionArena(device, layout))

    @property
    def layout(self) -> dict:
        return layout_dict(self.arena.get().layout())

    def reset(self) -> None:
        with nogil:
            self.arena.get().reset()

    def snapshot(self, int slot) -> None:
        with nogil:
            self.arena.get().snapshot(slot)

    def restore(self, int slot) -> None:
        with nogil:
            self.arena.get().restore(slot)

    def fill(self, int byte) -> None:
        """Set every byte of the arena (poison before proving reset)."""
        cdef unsigned char b = byte
        with nogil:
            cpp_arena_fill(self.arena.get()[0], b)

    def download(self):
        """The arena's bytes."""
        out = np.empty(self.arena.get().layout().total, np.uint8)
        cdef unsigned char[::1] view = out
        with nogil:
            cpp_arena_download(self.arena.get()[0], &view[0])
        return out

    def __dealloc__(self):
        with nogil:
            self.arena.reset()


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
