# The GPU <-> CPU expert exchange through the session's own token schedule (strata::exchange_check).
from libc.stdint cimport int32_t, uint64_t

from strata._native cimport CpuExpertPool, decode_mode
from strata.libstrata.check.exchange_check cimport ExchangeFaults, ExchangeTiming, cpp_exchange_run
from strata.libstrata.decode_session cimport DecodeMode
from strata.libstrata.expert_pool cimport CppExpertPool


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
