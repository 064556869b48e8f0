# The CPU pool's kernels on one expert (strata::pool_check): each half of an expert's product, computed by the
# code a layer job runs, for the tests that check it against the numpy reference; the row kernels timed alone; a
# layer job's claims of its work items.
from libc.stdint cimport int64_t

from strata._native cimport expert_matrix, pool_isa
from strata.libstrata.check.pool_check cimport (
    cpp_claim_items, cpp_claim_order, cpp_emulated_vnni_matvec, cpp_expert_hidden, cpp_expert_matvec, cpp_time_rows,
)
from strata.libstrata.expert_pool cimport ExpertMatrix, Isa


cdef ExpertMatrix _experts(q, int n_expert, str what, list keep) except *:
    from strata.runtime.pool import matrix_spec

    spec, arrays = matrix_spec(q, n_expert, what)
    keep += arrays
    return expert_matrix(spec)


cdef ExpertMatrix _one_expert(q, str what, list keep) except *:
    return _experts(q, 1, what, keep)


def expert_matvec(str isa, q, x, int rows_per_call=0):
    """y = W x for one expert's matrix `q` (a strata.quant.QuantTensor, or a float [rows, cols] array as repack
    makes it) with the pool's row kernels for `isa` ("avx2", "avx512" or "auto"); x goes in as a layer job
    gives it (float32 to a float form, q8_32 to a quantized one). The kernel runs on consecutive ranges of
    `rows_per_call` rows (0: all rows in one call). y is poisoned (NaN) before the run."""
    return _matvec(isa, q, x, rows_per_call, "expert_matvec")


def emulated_vnni_matvec(q, x, int rows_per_call=0):
    """expert_matvec with the AVX-512 kernels' own source built for AVX2, vpdpbusd emulated: their integer logic
    on a CPU without AVX-512 (quantized forms only)."""
    return _matvec(None, q, x, rows_per_call, "emulated_vnni_matvec")


def _matvec(isa, q, x, int rows_per_call, str what):
    """expert_matvec's run, through the kernels of `isa`, or the emulated VNNI ones where isa is None."""
    keep = []
    cdef ExpertMatrix m = _one_expert(q, what, keep)
    cdef Isa chosen = pool_isa("auto" if isa is None else isa)
    cdef bint emulated = isa is None
    cdef const float[::1] xv = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if xv.shape[0] != m.cols:
        raise InvalidArgument(f"{what}: x has {xv.shape[0]} entries, the matrix has {m.cols} columns")
    y = np.full(m.rows, np.nan, np.float32)
    cdef float[::1] yv = y
    with nogil:
        if emulated:
            cpp_emulated_vnni_matvec(m, 0, &xv[0], &yv[0], rows_per_call)
        else:
            cpp_expert_matvec(chosen, m, 0, &xv[0], &yv[0], rows_per_call)
    return y


def expert_hidden(str isa, gate, up, x):
    """h = silu(gate x) * up x of one expert (gate, up: as expert_matvec takes them), computed exactly as a layer
    job of the pool computes it. h is poisoned (NaN) before the run."""
    keep = []
    cdef ExpertMatrix g = _one_expert(gate, "expert_hidden gate", keep)
    cdef ExpertMatrix u = _one_expert(up, "expert_hidden up", keep)
    cdef Isa chosen = pool_isa(isa)
    cdef const float[::1] xv = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if xv.shape[0] != g.cols:
        raise InvalidArgument(f"expert_hidden: x has {xv.shape[0]} entries, gate has {g.cols} columns")
    h = np.full(g.rows, np.nan, np.float32)
    cdef float[::1] hv = h
    with nogil:
        cpp_expert_hidden(chosen, g, u, 0, &xv[0], &hv[0])
    return h


def time_expert_rows(str isa, q, int n_expert, x, long rows, long calls) -> float:
    """Seconds of `calls` runs of the pool's row kernels for `isa` over rows 0..rows-1 of an expert of `q` (which
    holds `n_expert` experts, expert-major, as ExpertPool.set_layer takes them), call c on expert c % n_expert,
    on this thread alone: one expert stays in the core's caches (the kernels' own speed), many stream from
    memory. x goes in as a layer job gives it."""
    keep = []
    cdef ExpertMatrix m = _experts(q, n_expert, "time_expert_rows", keep)
    cdef Isa chosen = pool_isa(isa)
    cdef const float[::1] xv = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if xv.shape[0] != m.cols:
        raise InvalidArgument(f"time_expert_rows: x has {xv.shape[0]} entries, the matrix has {m.cols} columns")
    cdef double seconds
    with nogil:
        seconds = cpp_time_rows(chosen, m, &xv[0], rows, calls)
    return seconds


def claim_order(long items, int parts, int p):
    """The order in which participant p, claiming alone, gets a layer job's `items` work items split in `parts`
    segments (cpu/item_claims.hpp): int64 [items]."""
    order = np.full(max(items, 0), -1, np.int64)
    cdef int64_t[::1] ov = order
    cdef int64_t* at = &ov[0] if items > 0 else NULL
    with nogil:
        cpp_claim_order(items, parts, p, at)
    return order


def claim_items(long items, int parts, delays_us):
    """`len(delays_us)` threads claiming a layer job's `items` items in `parts` segments at once, thread i
    starting delays_us[i] microseconds late: (claimed_by, claims), int32 [items] each, the participant that got
    each item and how often it was handed out."""
    cdef const int[::1] dv = np.ascontiguousarray(delays_us, dtype=np.int32)
    claimed_by = np.full(max(items, 0), -1, np.int32)
    claims = np.zeros(max(items, 0), np.int32)
    cdef int[::1] bv = claimed_by
    cdef int[::1] cv = claims
    cdef int* b = &bv[0] if items > 0 else NULL
    cdef int* c = &cv[0] if items > 0 else NULL
    cdef const int* d = &dv[0] if dv.shape[0] > 0 else NULL
    with nogil:
        cpp_claim_items(items, parts, <int>dv.shape[0], d, b, c)
    return claimed_by, claims

