# Router, shared-expert and hyper-connection kernels: host round trips (strata::kernel_check). Each uploads
# its inputs, runs one kernel into a poisoned, guarded output and copies it back: for tests and benchmarks.
from libc.stdint cimport int32_t

from strata._native cimport host_tensor
from strata._native_check_kernels cimport (
    HcReadOutputs, cpp_expert_slots, cpp_hc_read, cpp_hc_write, cpp_moe_cached_sum, cpp_moe_combine, cpp_moe_route,
    cpp_shared_expert_gate, cpp_swiglu,
)
from strata._native_weights cimport HostTensor

def _vector_f32(x, name: str, n: int | None = None):
    a = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if a.size == 0 or (n is not None and a.size != n):
        raise InvalidArgument(f"{name}: expected a non-empty float32 vector"
                              f"{'' if n is None else f' of {n} entries'}; found {a.size} entries")
    return a


def moe_route(logits, int k, int device=0):
    """Router of logits [tokens, n_expert]: (ids int32 [tokens, k], weights float32 [tokens, k]).

    Softmax over all experts, the k most probable in descending order (exact ties to the lower index),
    their probabilities renormalised to sum 1.
    """
    cdef const float[:, ::1] lv = _rows_f32(logits, "moe_route")
    cdef int tokens = lv.shape[0], n_expert = lv.shape[1]
    if k <= 0 or k > n_expert:
        raise InvalidArgument(f"moe_route: k={k} must lie in [1, n_expert={n_expert}]")
    ids = np.empty((tokens, k), np.int32)
    weights = np.empty((tokens, k), np.float32)
    cdef int32_t[:, ::1] iv = ids
    cdef float[:, ::1] wv = weights
    with nogil:
        cpp_moe_route(device, &lv[0, 0], tokens, n_expert, k, &iv[0, 0], &wv[0, 0])
    return ids, weights


def shared_expert_gate(w, x, int device=0) -> float:
    """The shared expert's scalar gate sigmoid(w . x) for float32 vectors w, x [n]."""
    cdef const float[::1] wv = _vector_f32(w, "shared_expert_gate (w)")
    cdef const float[::1] xv = _vector_f32(x, "shared_expert_gate (x)", wv.shape[0])
    cdef int n = wv.shape[0]
    cdef float gate
    with nogil:
        gate = cpp_shared_expert_gate(device, &wv[0], &xv[0], n)
    return gate


def swiglu(g, u, int device=0):
    """silu(g) * u for float32 vectors g, u [n]."""
    cdef const float[::1] gv = _vector_f32(g, "swiglu (g)")
    cdef const float[::1] uv = _vector_f32(u, "swiglu (u)", gv.shape[0])
    cdef int n = gv.shape[0]
    out = np.empty(n, np.float32)
    cdef float[::1] hv = out
    with nogil:
        cpp_swiglu(device, &gv[0], &uv[0], &hv[0], n)
    return out


def moe_combine(routed, shared, float gate, int device=0):
    """routed + gate * shared for float32 vectors [n] (the routed answer row and the shared expert's output)."""
    cdef const float[::1] rv = _vector_f32(routed, "moe_combine (routed)")
    cdef const float[::1] sv = _vector_f32(shared, "moe_combine (shared)", rv.shape[0])
    cdef int n = rv.shape[0]
    out = np.empty(n, np.float32)
    cdef float[::1] ov = out
    with nogil:
        cpp_moe_combine(device, &rv[0], &sv[0], gate, &ov[0], n)
    return out


def _vector_i32(x, name: str, n: int | None = None):
    a = np.ascontiguousarray(x, dtype=np.int32).reshape(-1)
    if a.size == 0 or (n is not None and a.size != n):
        raise InvalidArgument(f"{name}: expected a non-empty int32 vector"
                              f"{'' if n is None else f' of {n} entries'}; found {a.size} entries")
    return a


def expert_slots(slot_of, ids, int device=0):
    """slot_of[ids] (int32 [k]) on the device: where each chosen expert sits in a layer's VRAM cache (slot_of
    int32 [n_expert], -1 for an expert the cache does not hold; ids int32 [k], each checked to be an expert)."""
    cdef const int32_t[::1] sv = _vector_i32(slot_of, "expert_slots (slot_of)")
    cdef const int32_t[::1] iv = _vector_i32(ids, "expert_slots (ids)")
    cdef int n_expert = sv.shape[0], k = iv.shape[0]
    out = np.empty(k, np.int32)
    cdef int32_t[::1] ov = out
    with nogil:
        cpp_expert_slots(device, &sv[0], n_expert, &iv[0], k, &ov[0])
    return out


def moe_cached_sum(rows, slots, weights, out=None, int device=0):
    """The cached experts' share of the routed sum: Σ over j with slots[j] >= 0 of weights[j] * rows[j], float32 [n].

    rows float32 [k, n] (a skipped product's row is never read, so it may hold anything); slots int32 [k]; weights
    float32 [k]. With `out` (float32 [n]) the sum is added to it (the kernel's accumulate), else it starts from 0.
    """
    cdef const float[:, ::1] rv = _rows_f32(rows, "moe_cached_sum (rows)")
    cdef int k = rv.shape[0], n = rv.shape[1]
    cdef const int32_t[::1] sv = _vector_i32(slots, "moe_cached_sum (slots)", k)
    cdef const float[::1] wv = _vector_f32(weights, "moe_cached_sum (weights)", k)
    cdef bint accumulate = out is not None
    result = _vector_f32(out, "moe_cached_sum (out)", n).copy() if accumulate else np.empty(n, np.float32)
    cdef float[::1] ov = result
    with nogil:
        cpp_moe_cached_sum(device, &rv[0, 0], &sv[0], &wv[0], k, n, accumulate, &ov[0])
    return result


def hc_read(streams, norm, down, up, inject=None, *, float eps, int device=0) -> dict:
    """The hyper-connection read of streams H [hc, n] (docs/models/qwen4exp.md §3(a)) on the device.

    norm: float32 [hc * n]; down, up, inject: weights as strata.quant holds them (QuantTensor or float array),
    down [rank, hc*n], up [hc*n, rank], inject [hc, hc*n] or None (the final mixer). Returns the stages:
    normed [hc * n], low [rank], x [n] and, with inject, inj [hc].
    """
    cdef const float[:, ::1] hv = _rows_f32(streams, "hc_read (streams)")
    cdef int hc = hv.shape[0], n = hv.shape[1]
    cdef const float[::1] nv = _vector_f32(norm, "hc_read (norm)", hc * n)
    keep = []
    cdef HostTensor t_down = host_tensor("down", down, keep)
    cdef HostTensor t_up = host_tensor("up", up, keep)
    cdef HostTensor t_inject
    cdef const HostTensor* p_inject = NULL
    if inject is not None:
        t_inject = host_tensor("inject", inject, keep)
        p_inject = &t_inject
    result = {"normed": np.empty(hc * n, np.float32), "low": np.empty(t_down.rows, np.float32),
              "x": np.empty(n, np.float32)}
    if inject is not None:
        result["inj"] = np.empty(hc, np.float32)
    cdef float[::1] normed_v = result["normed"]
    cdef float[::1] low_v = result["low"]
    cdef float[::1] x_v = result["x"]
    cdef float[::1] inj_v = result.get("inj", np.empty(1, np.float32))
    cdef HcReadOutputs out
    out.normed = &normed_v[0]
    out.low = &low_v[0]
    out.x = &x_v[0]
    out.inj = &inj_v[0]
    with nogil:
        cpp_hc_read(device, &hv[0, 0], &nv[0], hc, n, eps, t_down, t_up, p_inject, out)
    return result


def hc_write(streams, inj, y, int device=0):
    """The write-back H[k] + inj[k] * y for streams H [hc, n], inj [hc], y [n]; returns the new streams."""
    cdef const float[:, ::1] hv = _rows_f32(streams, "hc_write (streams)")
    cdef int hc = hv.shape[0], n = hv.shape[1]
    cdef const float[::1] iv = _vector_f32(inj, "hc_write (inj)", hc)
    cdef const float[::1] yv = _vector_f32(y, "hc_write (y)", n)
    out = np.empty((hc, n), np.float32)
    cdef float[:, ::1] ov = out
    with nogil:
        cpp_hc_write(device, &hv[0, 0], &iv[0], &yv[0], &ov[0, 0], hc, n)
    return out
