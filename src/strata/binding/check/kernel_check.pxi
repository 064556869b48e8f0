# The kernels' host round trips (strata/check/kernel_check.hpp): each uploads its inputs, runs one kernel into a
# poisoned, guarded output and copies it back. For tests and benchmarks, not the token path. The per-token
# kernels take a leading rows (tokens) axis, one launch for all of them.
from libc.stdint cimport int8_t, int32_t, uint8_t, uint32_t
from libcpp.string cimport string

from strata._native cimport float_kind, host_tensor, quant_form, quant_planes
from strata.libstrata.check.kernel_check cimport (
    HcReadOutputs, RoutePublishOutputs, cpp_cache_slots, cpp_gather_rows, cpp_gemv_float, cpp_gemv_float_batch,
    cpp_gemv_float_inputs, cpp_gemv_quant, cpp_gemv_quant_batch, cpp_gemv_quant_inputs, cpp_hc_mix, cpp_hc_read,
    cpp_hc_read_fused,
    cpp_hc_stream_mean, cpp_hc_write, cpp_hc_write_steered, cpp_l2_norm,
    cpp_moe_cached_sum, cpp_moe_combine, cpp_moe_route, cpp_moe_weighted_rows, cpp_quantize_q8_32, cpp_raise_error,
    cpp_rms_norm, cpp_rms_norm_gated, cpp_rms_norm_grouped, cpp_rope_neox, cpp_route_publish, cpp_sample_tokens,
    SampleExtras, cpp_shared_expert_gate, cpp_swiglu, cpp_time_gemv_float, cpp_time_gemv_quant, cpp_time_gemv_quant_batch, cpp_time_gemv_quant_inputs,
    cpp_time_gemv_float_inputs,
)
from strata.libstrata.check.q8_host cimport Q8Host
from strata.libstrata.device_weights cimport HostTensor
from strata.libstrata.forms cimport FloatKind, QuantForm, QuantPlanes


def raise_error(str kind) -> None:
    """Throw the C++ error kind `kind` ("invalid_argument", "out_of_memory", "format", "cuda", "error"), so tests
    can prove that each arrives as the right strata.errors class."""
    cdef string k = kind.encode()
    with nogil:
        cpp_raise_error(k)


# Quantization and GEMVs.
def quantize_q8_32(x, int device=0):
    """q8_32 of float32 x [n] (n a multiple of 32) on GPU `device`: (xq int8 [n], dx float32, sums int32 [n/32])."""
    cdef const float[::1] xv = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    cdef long n = xv.shape[0]
    if n == 0 or n % 32:
        raise InvalidArgument(f"quantize_q8_32: x has {n} elements, expected a positive multiple of 32")
    xq = np.empty(n, np.int8)
    dx = np.empty(n // 32, np.float32)
    sums = np.empty(n // 32, np.int32)
    cdef int8_t[::1] xqv = xq
    cdef float[::1] dxv = dx
    cdef int32_t[::1] sv = sums
    with nogil:
        cpp_quantize_q8_32(device, &xv[0], n, &xqv[0], &dxv[0], &sv[0])
    return xq, dx, sums


cdef tuple _gemv_weight(weight, QuantForm* form, QuantPlanes* planes, FloatKind* kind, list keep):
    """(rows, cols, float bytes) of a weight as the GEMV hooks take it: a float array [rows, cols] (float32, float16,
    uint16 = bf16 bits; *kind set, its elements returned as uint8) or a strata.quant.QuantTensor (*form and *planes
    set, their arrays kept alive in `keep`; None for the bytes)."""
    if isinstance(weight, np.ndarray):
        kind[0] = float_kind(weight)
        return weight.shape[0], weight.shape[1], np.ascontiguousarray(weight).reshape(-1).view(np.uint8)
    form[0] = quant_form(weight.form)
    planes[0] = quant_planes(weight, keep)
    return weight.rows, weight.cols, None


def gemv(weight, x, int device=0):
    """y = W x (float32 [rows]) on GPU `device`.

    `weight` is a strata.quant.QuantTensor (x is quantized to q8_32 on the device, then the form's GEMV runs)
    or a float weight [rows, cols] as strata.quant.repack returns it (float32, float16, uint16 = bf16 bits).
    """
    cdef const float[::1] xv = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    cdef int rows, cols
    cdef QuantForm form
    cdef QuantPlanes planes
    cdef FloatKind kind
    cdef const unsigned char[::1] wv
    keep = []
    rows, cols, float_bytes = _gemv_weight(weight, &form, &planes, &kind, keep)
    if xv.shape[0] != cols:
        raise InvalidArgument(f"gemv: x has {xv.shape[0]} elements, the weight has {cols} columns")
    y = np.empty(rows, np.float32)
    cdef float[::1] yv = y
    if float_bytes is not None:
        wv = float_bytes
        with nogil:
            cpp_gemv_float(device, kind, &wv[0], rows, cols, &xv[0], &yv[0])
    else:
        with nogil:
            cpp_gemv_quant(device, form, planes, rows, cols, &xv[0], &yv[0])
    return y


def gemv_batch(stack, int n_matrix, slots, x, int device=0, int split=0):
    """y [count, rows] (float32), y[j] = M[slots[j]] x_j, over a stack of n_matrix matrices on GPU `device`.

    `stack` is one weight as gemv takes it, of n_matrix * rows rows: matrix m is its rows m * rows .. m * rows +
    rows - 1. slots: int [count]; a negative slot skips its product, whose row of y comes back NaN (the poison,
    never written). x: float32 [cols], read by every product (x_stride 0), or [count, x_stride], x_stride >= cols,
    product j reading row j's first cols. `split` (a quantized stack): warps per weight row, 0 the kernels' rule,
    else 1, 2 or 4. The native hook checks count, x_stride, split and the slots first.
    """
    cdef const int32_t[::1] sv = np.ascontiguousarray(slots, dtype=np.int32).reshape(-1)
    cdef int count = sv.shape[0]
    cdef const int32_t* slots_at = &sv[0] if count else NULL
    cdef int rows, cols, x_stride
    cdef QuantForm form
    cdef QuantPlanes planes
    cdef FloatKind kind
    cdef const unsigned char[::1] wv
    keep = []
    stack_rows, cols, float_bytes = _gemv_weight(stack, &form, &planes, &kind, keep)
    if n_matrix < 1 or stack_rows % n_matrix:
        raise InvalidArgument(f"gemv_batch: a stack of {stack_rows} rows is not {n_matrix} matrices of equal rows")
    rows = stack_rows // n_matrix
    xa = np.ascontiguousarray(x, dtype=np.float32)
    if xa.ndim == 1 and xa.shape[0] == cols:
        x_stride = 0
    elif xa.ndim == 2 and xa.shape[0] == count and xa.size:
        x_stride = xa.shape[1]
    else:
        raise InvalidArgument(f"gemv_batch: x has shape {xa.shape}; expected ({cols},) or ({count}, x_stride)")
    cdef const float[::1] xv = xa.reshape(-1)
    y = np.empty((count, rows), np.float32)
    cdef float[::1] yv = y.reshape(-1)
    cdef float* y_at = &yv[0] if y.size else NULL
    if float_bytes is not None:
        wv = float_bytes
        with nogil:
            cpp_gemv_float_batch(device, kind, &wv[0], n_matrix, rows, cols, slots_at, count, x_stride, &xv[0], y_at)
    else:
        with nogil:
            cpp_gemv_quant_batch(device, form, planes, n_matrix, rows, cols, slots_at, count, x_stride, &xv[0], y_at,
                                 split)
    return y


# The multi-input GEMV's kernels by name (kernel_check.hpp): the launcher's choice, the integer walk, the tensor cores.
_INPUTS_KERNELS = {"chosen": 0, "integer": 1, "tensor_cores": 2}


def _inputs_kernel(str kernel) -> int:
    if kernel not in _INPUTS_KERNELS:
        raise InvalidArgument(f"kernel {kernel!r} is none of {', '.join(_INPUTS_KERNELS)}")
    return _INPUTS_KERNELS[kernel]


def gemv_inputs(weight, x, int device=0, str kernel="chosen"):
    """y [inputs, rows] (float32), y[i] = W x_i on GPU `device`, in one multi-input GEMV (each weight block decoded
    once for every input). `weight` as gemv takes it; x: float32 [inputs, x_stride], x_stride >= cols (for a
    quantized weight a multiple of 32), row i's first cols the activation. `kernel` (a quantized weight):
    "chosen" (the launcher's), "integer" or "tensor_cores"; a float weight has one kernel (gemv_float_inputs). The
    native hook checks inputs, x_stride and the kernel first.
    """
    cdef int kernel_id = _inputs_kernel(kernel)
    cdef QuantForm form
    cdef QuantPlanes planes
    cdef FloatKind kind
    cdef const unsigned char[::1] wv
    cdef int inputs, x_stride, rows, cols
    keep = []
    rows, cols, float_bytes = _gemv_weight(weight, &form, &planes, &kind, keep)
    if float_bytes is not None and kernel != "chosen":
        raise InvalidArgument(f"gemv_inputs: a float weight has one kernel; {kernel!r} is the quantized forms'")
    xa = np.ascontiguousarray(x, dtype=np.float32)
    if xa.ndim != 2 or xa.size == 0:
        raise InvalidArgument(f"gemv_inputs: x has shape {xa.shape}; expected (inputs, x_stride >= {cols})")
    inputs, x_stride = xa.shape[0], xa.shape[1]
    cdef const float[::1] xv = xa.reshape(-1)
    y = np.empty((inputs, rows), np.float32)
    cdef float[::1] yv = y.reshape(-1)
    if float_bytes is not None:
        wv = float_bytes
        with nogil:
            cpp_gemv_float_inputs(device, kind, &wv[0], rows, cols, inputs, x_stride, &xv[0], &yv[0])
    else:
        with nogil:
            cpp_gemv_quant_inputs(device, form, planes, rows, cols, inputs, x_stride, &xv[0], &yv[0], kernel_id)
    return y


def time_gemv(weight, int reps=20, int device=0) -> float:
    """Median seconds of one GEMV launch of `weight` (as gemv takes it) with a cold L2, over `reps` batches."""
    cdef int rows, cols
    cdef QuantForm form
    cdef QuantPlanes planes
    cdef FloatKind kind
    cdef const unsigned char[::1] wv
    cdef double seconds
    keep = []
    rows, cols, float_bytes = _gemv_weight(weight, &form, &planes, &kind, keep)
    if float_bytes is not None:
        wv = float_bytes
        with nogil:
            seconds = cpp_time_gemv_float(device, kind, &wv[0], rows, cols, reps)
    else:
        with nogil:
            seconds = cpp_time_gemv_quant(device, form, planes, rows, cols, reps)
    return seconds


# Norms and RoPE.
def rms_norm(x, w, float eps, int device=0, bint q8=False):
    """RMSNorm of each row of x (float32 [rows, cols]) times w (float32 [cols]), on GPU `device`. With q8 also the
    kernel's q8_32 form of the output (cols a multiple of 32): returns (out, (xq, dx, sums)) over rows * cols."""
    cdef const float[:, ::1] xv = np.ascontiguousarray(x, dtype=np.float32)
    cdef const float[::1] wv = np.ascontiguousarray(w, dtype=np.float32)
    rows, cols = xv.shape[0], xv.shape[1]
    if wv.shape[0] != cols:
        raise InvalidArgument(f"rms_norm: weight has {wv.shape[0]} entries, rows have {cols}")
    if rows == 0 or cols == 0:
        raise InvalidArgument(f"rms_norm: empty input of shape ({rows}, {cols})")
    out = np.empty((rows, cols), dtype=np.float32)
    cdef float[:, ::1] yv = out
    cdef int r = rows, c = cols
    q8_arrays = _q8_arrays(1, rows * cols) if q8 else None
    cdef Q8Host q8_host = _q8_host(q8_arrays)
    with nogil:
        cpp_rms_norm(device, &xv[0, 0], &wv[0], &yv[0, 0], r, c, eps, q8_host)
    return (out, _flat_q8(q8_arrays)) if q8 else out


def _rows_f32(x, name: str, cols: int | None = None):
    a = np.ascontiguousarray(x, dtype=np.float32)
    if a.ndim != 2 or a.size == 0 or (cols is not None and a.shape[1] != cols):
        raise InvalidArgument(f"{name}: expected a non-empty 2-D float32 array"
                              f"{'' if cols is None else f' of {cols} columns'}; found shape {a.shape}")
    return a


def rms_norm_grouped(x, w, int groups, float eps, int device=0):
    """x [rows, groups*cols]: each of `groups` slices RMS-normalised on its own, times w [groups*cols]."""
    cdef const float[:, ::1] xv = _rows_f32(x, "rms_norm_grouped")
    cdef const float[::1] wv = np.ascontiguousarray(w, dtype=np.float32).reshape(-1)
    cdef int rows = xv.shape[0], width = xv.shape[1]
    if groups <= 0 or width % groups or wv.shape[0] != width:
        raise InvalidArgument(f"rms_norm_grouped: rows of {width} floats, weight of {wv.shape[0]}, groups={groups}: "
                              "expected groups to divide the row and the weight to match it")
    cdef int cols = width // groups
    out = np.empty((rows, width), np.float32)
    cdef float[:, ::1] yv = out
    with nogil:
        cpp_rms_norm_grouped(device, &xv[0, 0], &wv[0], &yv[0, 0], rows, groups, cols, eps)
    return out


def rms_norm_gated(x, z, w, float eps, str gate="sigmoid", int device=0, bint q8=False):
    """Per head (rows of x, z [heads, head_dim]): rms_norm(x) * w * gate(z), gate 'sigmoid' or 'silu'. With q8 also
    the kernel's q8_32 form of the output (head_dim a multiple of 32): returns (out, (xq, dx, sums))."""
    cdef const float[:, ::1] xv = _rows_f32(x, "rms_norm_gated")
    cdef const float[:, ::1] zv = _rows_f32(z, "rms_norm_gated (z)", xv.shape[1])
    cdef const float[::1] wv = np.ascontiguousarray(w, dtype=np.float32).reshape(-1)
    cdef int heads = xv.shape[0], head_dim = xv.shape[1]
    if zv.shape[0] != heads or wv.shape[0] != head_dim:
        raise InvalidArgument(f"rms_norm_gated: x {heads}x{head_dim}, z {zv.shape[0]}x{zv.shape[1]}, "
                              f"w {wv.shape[0]}: expected z like x and w of head_dim")
    cdef string g = gate.encode()
    out = np.empty((heads, head_dim), np.float32)
    cdef float[:, ::1] yv = out
    q8_arrays = _q8_arrays(1, heads * head_dim) if q8 else None
    cdef Q8Host q8_host = _q8_host(q8_arrays)
    with nogil:
        cpp_rms_norm_gated(device, &xv[0, 0], &zv[0, 0], &wv[0], &yv[0, 0], heads, head_dim, eps, g, q8_host)
    return (out, _flat_q8(q8_arrays)) if q8 else out


def l2_norm(x, float eps, int device=0):
    """Per row of x [heads, head_dim]: x / sqrt(sum x^2 + eps)."""
    cdef const float[:, ::1] xv = _rows_f32(x, "l2_norm")
    cdef int heads = xv.shape[0], head_dim = xv.shape[1]
    out = np.empty((heads, head_dim), np.float32)
    cdef float[:, ::1] yv = out
    with nogil:
        cpp_l2_norm(device, &xv[0, 0], &yv[0, 0], heads, head_dim, eps)
    return out


def rope_neox(x, positions, int rope_dim, double theta, int device=0):
    """NEOX RoPE of x [tokens, heads, head_dim] on its first rope_dim dims at int positions [tokens]."""
    a = np.ascontiguousarray(x, dtype=np.float32)
    p = np.ascontiguousarray(positions, dtype=np.int32).reshape(-1)
    if a.ndim != 3 or a.size == 0 or p.shape[0] != a.shape[0]:
        raise InvalidArgument(f"rope_neox: x must be [tokens, heads, head_dim] with one position per token; "
                              f"found x {a.shape}, positions {p.shape}")
    cdef const float[:, :, ::1] xv = a
    cdef const int32_t[::1] pv = p
    cdef int tokens = a.shape[0], heads = a.shape[1], head_dim = a.shape[2]
    out = np.empty(a.shape, np.float32)
    cdef float[:, :, ::1] yv = out
    with nogil:
        cpp_rope_neox(device, &xv[0, 0, 0], &pv[0], &yv[0, 0, 0], tokens, heads, head_dim, rope_dim, theta)
    return out


# Router, shared expert, routed rows and hyper-connections.
def _vector_f32(x, name: str, n: int | None = None):
    a = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if a.size == 0 or (n is not None and a.size != n):
        raise InvalidArgument(f"{name}: expected a non-empty float32 vector"
                              f"{'' if n is None else f' of {n} entries'}; found {a.size} entries")
    return a


def _shaped(x, dtype, name: str, shape: tuple):
    """x as a C-contiguous array of dtype whose shape is `shape` (None: any extent), none of it empty."""
    a = np.ascontiguousarray(x, dtype=dtype)
    if a.ndim != len(shape) or a.size == 0 or any(w is not None and g != w for g, w in zip(a.shape, shape)):
        want = ", ".join("any" if w is None else str(w) for w in shape) + ("," if len(shape) == 1 else "")
        raise InvalidArgument(f"{name}: expected a non-empty {a.dtype} array of shape ({want}); found {a.shape}")
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



def route_publish(router, x, int k, slot_of=None, bint ring=True, int ring_base=1000, int device=0) -> dict:
    """The decode step's fused router (kernels/router_publish.cuh) of `router` [n_expert, n] (a weight as
    strata.quant holds it: QuantTensor or float array; x goes to q8_32 first for a quantized one) on each row of
    x [replays, n]: one captured CUDA graph replayed per row, replay r ringing ring_base + r + 1 when `ring`.

    Returns, each with a leading replays axis: logits [n_expert], ids, weights and slots [k] (slot_of[ids]; -1,
    the poison, without slot_of), the doorbell as the host read it after the replay (bell_x [n], bell_ids,
    bell_weights [k], seq [1]; poisoned with 0xFF bytes before each replay: NaN or -1 where nothing was
    written); and ticket (uint32 [1]), the CTAs' ticket after the last replay.
    """
    cdef const float[:, ::1] xv = _rows_f32(x, "route_publish (x)")
    keep = []
    cdef HostTensor t = host_tensor("router", router, keep)
    cdef int replays = xv.shape[0], n = xv.shape[1], n_expert = t.rows
    if t.cols != n:
        raise InvalidArgument(f"route_publish: x has {n} columns, the router has {t.cols}")
    if k <= 0:
        raise InvalidArgument(f"route_publish: k={k} must be positive")
    cdef const int32_t[::1] sv
    cdef const int32_t* slot_at = NULL
    if slot_of is not None:
        sv = _vector_i32(slot_of, "route_publish (slot_of)", n_expert)
        slot_at = &sv[0]
    result = {"logits": np.empty((replays, n_expert), np.float32), "ids": np.empty((replays, k), np.int32),
              "weights": np.empty((replays, k), np.float32), "slots": np.empty((replays, k), np.int32),
              "bell_x": np.empty((replays, n), np.float32), "bell_ids": np.empty((replays, k), np.int32),
              "bell_weights": np.empty((replays, k), np.float32), "seq": np.empty((replays, 1), np.int32),
              "ticket": np.empty(1, np.uint32)}
    cdef float[:, ::1] logits_v = result["logits"]
    cdef int32_t[:, ::1] ids_v = result["ids"]
    cdef float[:, ::1] weights_v = result["weights"]
    cdef int32_t[:, ::1] slots_v = result["slots"]
    cdef float[:, ::1] bell_x_v = result["bell_x"]
    cdef int32_t[:, ::1] bell_ids_v = result["bell_ids"]
    cdef float[:, ::1] bell_weights_v = result["bell_weights"]
    cdef int32_t[:, ::1] seq_v = result["seq"]
    cdef uint32_t[::1] ticket_v = result["ticket"]
    cdef RoutePublishOutputs out
    out.logits = &logits_v[0, 0]
    out.ids = &ids_v[0, 0]
    out.weights = &weights_v[0, 0]
    out.slots = &slots_v[0, 0]
    out.bell_x = &bell_x_v[0, 0]
    out.bell_ids = &bell_ids_v[0, 0]
    out.bell_weights = &bell_weights_v[0, 0]
    out.seq = &seq_v[0, 0]
    out.ticket = &ticket_v[0]
    with nogil:
        cpp_route_publish(device, t, &xv[0, 0], replays, k, slot_at, ring, ring_base, out)
    return result


def shared_expert_gate(w, x, int device=0):
    """The shared expert's gates sigmoid(w . x[r]) (float32 [rows]) for float32 w [n] and x [rows, n]."""
    cdef const float[::1] wv = _vector_f32(w, "shared_expert_gate (w)")
    cdef int n = wv.shape[0]
    cdef const float[:, ::1] xv = _shaped(x, np.float32, "shared_expert_gate (x)", (None, n))
    cdef int rows = xv.shape[0]
    gates = np.empty(rows, np.float32)
    cdef float[::1] gv = gates
    with nogil:
        cpp_shared_expert_gate(device, &wv[0], &xv[0, 0], rows, n, &gv[0])
    return gates


def swiglu(g, u, int device=0, bint q8=False):
    """silu(g) * u for float32 vectors g, u [n]. With q8 also the kernel's q8_32 form of the output (n a multiple
    of 32): returns (out, (xq, dx, sums))."""
    cdef const float[::1] gv = _vector_f32(g, "swiglu (g)")
    cdef const float[::1] uv = _vector_f32(u, "swiglu (u)", gv.shape[0])
    cdef int n = gv.shape[0]
    out = np.empty(n, np.float32)
    cdef float[::1] hv = out
    q8_arrays = _q8_arrays(1, n) if q8 else None
    cdef Q8Host q8_host = _q8_host(q8_arrays)
    with nogil:
        cpp_swiglu(device, &gv[0], &uv[0], &hv[0], n, q8_host)
    return (out, _flat_q8(q8_arrays)) if q8 else out


def moe_combine(routed, shared, gate, int device=0):
    """routed + gate[r] * shared row by row for float32 routed, shared [rows, n] (the routed answer rows and the
    shared expert's outputs) and gate [rows]."""
    cdef const float[:, ::1] rv = _shaped(routed, np.float32, "moe_combine (routed)", (None, None))
    cdef int rows = rv.shape[0], n = rv.shape[1]
    cdef const float[:, ::1] sv = _shaped(shared, np.float32, "moe_combine (shared)", (rows, n))
    cdef const float[::1] gv = _shaped(gate, np.float32, "moe_combine (gate)", (rows,))
    out = np.empty((rows, n), np.float32)
    cdef float[:, ::1] ov = out
    with nogil:
        cpp_moe_combine(device, &rv[0, 0], &sv[0, 0], &gv[0], &ov[0, 0], rows, n)
    return out


def _vector_i32(x, name: str, n: int | None = None):
    a = np.ascontiguousarray(x, dtype=np.int32).reshape(-1)
    if a.size == 0 or (n is not None and a.size != n):
        raise InvalidArgument(f"{name}: expected a non-empty int32 vector"
                              f"{'' if n is None else f' of {n} entries'}; found {a.size} entries")
    return a


def moe_cached_sum(rows, slots, weights, out=None, int device=0):
    """The cached experts' share of each token's routed sum: row t is the sum over j with slots[t, j] >= 0 of
    weights[t, j] * rows[t, j], float32 [tokens, n].

    rows float32 [tokens, k, n] (a skipped product's row is never read, so it may hold anything); slots int32
    [tokens, k]; weights float32 [tokens, k]. With `out` (float32 [tokens, n]) the sums are added to it (the
    kernel's accumulate), else they start from 0.
    """
    rows_a = _shaped(rows, np.float32, "moe_cached_sum (rows)", (None, None, None))
    cdef int tokens = rows_a.shape[0], k = rows_a.shape[1], n = rows_a.shape[2]
    cdef const float[::1] rv = rows_a.reshape(-1)
    cdef const int32_t[:, ::1] sv = _shaped(slots, np.int32, "moe_cached_sum (slots)", (tokens, k))
    cdef const float[:, ::1] wv = _shaped(weights, np.float32, "moe_cached_sum (weights)", (tokens, k))
    cdef bint accumulate = out is not None
    if accumulate:
        result = _shaped(out, np.float32, "moe_cached_sum (out)", (tokens, n)).copy()
    else:
        result = np.empty((tokens, n), np.float32)
    cdef float[:, ::1] ov = result
    with nogil:
        cpp_moe_cached_sum(device, &rv[0], &sv[0, 0], &wv[0, 0], tokens, k, n, accumulate, &ov[0, 0])
    return result


def moe_weighted_rows(rows, row_of, weights, int device=0):
    """Each token's routed sum from expert-grouped rows: row t is the sum over j with row_of[t, j] >= 0 of
    weights[t, j] * rows[row_of[t, j]], float32 [tokens, n].

    rows float32 [m, n]; row_of int32 [tokens, k] (each checked to be a row of `rows` or negative: skipped);
    weights float32 [tokens, k].
    """
    cdef const float[:, ::1] rv = _shaped(rows, np.float32, "moe_weighted_rows (rows)", (None, None))
    cdef int m = rv.shape[0], n = rv.shape[1]
    cdef const int32_t[:, ::1] iv = _shaped(row_of, np.int32, "moe_weighted_rows (row_of)", (None, None))
    cdef int tokens = iv.shape[0], k = iv.shape[1]
    cdef const float[:, ::1] wv = _shaped(weights, np.float32, "moe_weighted_rows (weights)", (tokens, k))
    out = np.empty((tokens, n), np.float32)
    cdef float[:, ::1] ov = out
    with nogil:
        cpp_moe_weighted_rows(device, &rv[0, 0], m, &iv[0, 0], &wv[0, 0], tokens, k, n, &ov[0, 0])
    return out


def gather_rows(src, index, int device=0):
    """src[index] (float32 [m, n]) on the device for float32 src [rows, n] and int32 index [m] (each checked to
    be a row of src)."""
    cdef const float[:, ::1] sv = _shaped(src, np.float32, "gather_rows (src)", (None, None))
    cdef int src_rows = sv.shape[0], n = sv.shape[1]
    cdef const int32_t[::1] iv = _shaped(index, np.int32, "gather_rows (index)", (None,))
    cdef int m = iv.shape[0]
    out = np.empty((m, n), np.float32)
    cdef float[:, ::1] ov = out
    with nogil:
        cpp_gather_rows(device, &sv[0, 0], src_rows, &iv[0], m, n, &ov[0, 0])
    return out


def cache_slots(slot_of, ids, int device=0):
    """slot_of[ids] (int32 [count]) on the device for int32 slot_of [n_expert] (-1: not held) and int32 ids
    [count] (each checked to be an expert)."""
    cdef const int32_t[::1] sv = _shaped(slot_of, np.int32, "cache_slots (slot_of)", (None,))
    cdef const int32_t[::1] iv = _shaped(ids, np.int32, "cache_slots (ids)", (None,))
    cdef int n_expert = sv.shape[0], count = iv.shape[0]
    out = np.empty(count, np.int32)
    cdef int32_t[::1] ov = out
    with nogil:
        cpp_cache_slots(device, &sv[0], n_expert, &iv[0], count, &ov[0])
    return out


cdef float* _f32_at(dict result, str key):
    cdef float[::1] v = result[key]
    return &v[0]


def hc_read(streams, norm, down, up, inject=None, *, float eps, bint fused=False, bint q8=False,
            int device=0) -> dict:
    """The hyper-connection read of streams H [hc, n] (docs/models/qwen4exp.md §3(a)) on the device.

    norm: float32 [hc * n]; down, up, inject: weights as strata.quant holds them (QuantTensor or float array),
    down [rank, hc*n], up [hc*n, rank], inject [hc, hc*n] or None (the final mixer). Returns low [rank], x [n]
    and, with inject, inj [hc]; chained (fused False: the eight kernels) also normed [hc * n]; fused (the decode
    step's two launches, kernels/hc_read.cuh) also rms [hc] (each stream's inverse RMS) and, with q8, q8: x's
    q8_32 form as hc_read_up_mix wrote it beside x (xq int8 [n], dx float32 and sums int32 [n / 32]).
    """
    if q8 and not fused:
        raise InvalidArgument("hc_read: x's q8_32 form comes from the fused read only (fused=True)")
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
    result = {"low": np.empty(t_down.rows, np.float32), "x": np.empty(n, np.float32), "inj": np.empty(hc, np.float32)}
    result["rms" if fused else "normed"] = np.empty(hc if fused else hc * n, np.float32)
    q8_arrays = _q8_arrays(1, n) if q8 else None
    cdef HcReadOutputs out
    out.low = _f32_at(result, "low")
    out.x = _f32_at(result, "x")
    out.inj = _f32_at(result, "inj")
    if fused:
        out.rms = _f32_at(result, "rms")
        out.x_q8 = _q8_host(q8_arrays)
        with nogil:
            cpp_hc_read_fused(device, &hv[0, 0], &nv[0], hc, n, eps, t_down, t_up, p_inject, out)
    else:
        out.normed = _f32_at(result, "normed")
        with nogil:
            cpp_hc_read(device, &hv[0, 0], &nv[0], hc, n, eps, t_down, t_up, p_inject, out)
    if inject is None:
        del result["inj"]
    if q8:
        result["q8"] = _flat_q8(q8_arrays)
    return result


def hc_mix(up, normed, int device=0):
    """The block input x [rows, n] = the mean over the streams of sigmoid(up) * normed, for float32 up and
    normed [rows, hc, n] (the up projection and the grouped-normalised streams of each token)."""
    up_a = _shaped(up, np.float32, "hc_mix (up)", (None, None, None))
    cdef int rows = up_a.shape[0], hc = up_a.shape[1], n = up_a.shape[2]
    cdef const float[::1] uv = up_a.reshape(-1)
    cdef const float[::1] nv = _shaped(normed, np.float32, "hc_mix (normed)", (rows, hc, n)).reshape(-1)
    out = np.empty((rows, n), np.float32)
    cdef float[:, ::1] ov = out
    with nogil:
        cpp_hc_mix(device, &uv[0], &nv[0], &ov[0, 0], rows, hc, n)
    return out


def hc_write(streams, inj, y, int device=0):
    """The write-back H[r, k] + inj[k] * y[r] for streams H [rows, hc, n] and y [rows, n]; returns the new streams.

    inj [hc] gives every row the same weights (the kernel's inj_stride 0), inj [rows, hc] each row its own.
    """
    h_a = _shaped(streams, np.float32, "hc_write (streams)", (None, None, None))
    cdef int rows = h_a.shape[0], hc = h_a.shape[1], n = h_a.shape[2]
    cdef const float[::1] hv = h_a.reshape(-1)
    per_row = np.ndim(inj) == 2
    cdef int inj_stride = hc if per_row else 0
    inj_a = _shaped(inj, np.float32, "hc_write (inj)", h_a.shape[:2] if per_row else h_a.shape[1:2])
    cdef const float[::1] iv = inj_a.reshape(-1)
    cdef const float[:, ::1] yv = _shaped(y, np.float32, "hc_write (y)", (rows, n))
    out = np.empty((rows, hc, n), np.float32)
    cdef float[::1] ov = out.reshape(-1)
    with nogil:
        cpp_hc_write(device, &hv[0], &iv[0], inj_stride, &yv[0, 0], &ov[0], rows, hc, n)
    return out


def hc_write_steered(streams, inj, y, vectors, row_has=None, int device=0):
    """hc_write, then each row's control vector: vectors [n] added to every row, or vectors [rows, n] each row's own
    (row_has [rows] bools: False gives that row none), through the kernel's per-row table; returns the new streams."""
    h_a = _shaped(streams, np.float32, "hc_write_steered (streams)", (None, None, None))
    cdef int rows = h_a.shape[0], hc = h_a.shape[1], n = h_a.shape[2]
    cdef const float[::1] hv = h_a.reshape(-1)
    per_row_inj = np.ndim(inj) == 2
    cdef int inj_stride = hc if per_row_inj else 0
    inj_a = _shaped(inj, np.float32, "hc_write_steered (inj)", h_a.shape[:2] if per_row_inj else h_a.shape[1:2])
    cdef const float[::1] iv = inj_a.reshape(-1)
    cdef const float[:, ::1] yv = _shaped(y, np.float32, "hc_write_steered (y)", (rows, n))
    cdef bint per_row = np.ndim(vectors) == 2
    if per_row:
        v_a = _shaped(vectors, np.float32, "hc_write_steered (vectors)", (rows, n))
    else:
        v_a = _shaped(vectors, np.float32, "hc_write_steered (vectors)", (n,))
    cdef const float[::1] vv = v_a.reshape(-1)
    has = np.ones(rows, np.uint8) if row_has is None else np.ascontiguousarray(row_has, dtype=np.uint8)
    if has.shape != (rows,):
        raise InvalidArgument(f"hc_write_steered (row_has): expected {rows} flags, found shape {has.shape}")
    cdef const uint8_t[::1] hsv = has
    out = np.empty((rows, hc, n), np.float32)
    cdef float[::1] ov = out.reshape(-1)
    with nogil:
        cpp_hc_write_steered(device, &hv[0], &iv[0], inj_stride, &yv[0, 0], &vv[0], &hsv[0], per_row, &ov[0], rows,
                             hc, n)
    return out


def hc_stream_mean(streams, int device=0):
    """The mean of one row's streams [hc, n] (summed in float64, rounded to float32): `strata cvector`'s state."""
    h_a = _shaped(streams, np.float32, "hc_stream_mean (streams)", (None, None))
    cdef int hc = h_a.shape[0], n = h_a.shape[1]
    cdef const float[::1] hv = h_a.reshape(-1)
    out = np.empty(n, np.float32)
    cdef float[::1] ov = out
    with nogil:
        cpp_hc_stream_mean(device, &hv[0], &ov[0], hc, n)
    return out


# The token sampler.
def sample_tokens(logits, params, draws, seen=(), bint graph=False, bint argmax_path=False, int device=0):
    """The token strata.sampling.sample(logits, params, u, seen) picks for each u in `draws`, on GPU `device`.

    `params` is a strata.sampling.SamplingParams, every field taken (logit_bias, the frequency and presence
    penalties over seen[answer_start:], token_mask); returns int32 [len(draws)]. With graph=True the sampler is
    captured once into a CUDA graph and replayed per draw, the values rewritten in device memory in between.
    With argmax_path=True the launch is the argmax's without a sort (sample_argmax), as the decode step runs it
    for greedy or top-k 1 values (anything else is refused).
    """
    cdef const float[::1] lv = np.ascontiguousarray(logits, dtype=np.float32).reshape(-1)
    cdef const double[::1] dv = np.ascontiguousarray(draws, dtype=np.float64).reshape(-1)
    # Clipping to the int32 range keeps an out-of-range id out of range, so the native check still names it.
    seen64 = np.asarray(seen, dtype=np.int64).reshape(-1)
    cdef const int32_t[::1] sv = np.clip(seen64, np.iinfo(np.int32).min, np.iinfo(np.int32).max).astype(np.int32)
    cdef int vocab = lv.shape[0], n_seen = sv.shape[0], n_draws = dv.shape[0]
    cdef double temperature = params.temperature, top_p = params.top_p, min_p = params.min_p
    cdef double repeat_penalty = params.repeat_penalty
    cdef int top_k = params.top_k
    # the fields past the filters' may be absent (a namespace of the filters' values): off
    cdef SampleExtras extras
    extras.frequency_penalty = getattr(params, "frequency_penalty", 0.0)
    extras.presence_penalty = getattr(params, "presence_penalty", 0.0)
    extras.answer_start = getattr(params, "answer_start", 0)
    bias, mask = getattr(params, "logit_bias", ()), getattr(params, "token_mask", None)
    cdef const float[::1] bias_view
    cdef const int32_t[::1] mask_view
    if bias:
        ids, values = np.array(bias, np.float64).T
        if ids.max() >= vocab:
            raise InvalidArgument(f"logit_bias: token {int(ids.max())} is outside the {vocab} logits")
        dense = np.zeros(vocab, np.float32)
        dense[ids.astype(np.int64)] = values.astype(np.float32)
        bias_view = dense
        extras.bias = &bias_view[0]
    if mask is not None:
        words = np.zeros(max((vocab + 31) // 32, mask.size), np.int32)
        mask.fill(words)
        mask_view = words
        extras.mask = &mask_view[0]
    tokens = np.empty(n_draws, np.int32)
    cdef int32_t[::1] tv = tokens
    # Empty inputs pass NULL; the native checks refuse them before reading.
    cdef const float* lp = &lv[0] if vocab else NULL
    cdef const int32_t* sp = &sv[0] if n_seen else NULL
    cdef const double* dp = &dv[0] if n_draws else NULL
    cdef int32_t* tp = &tv[0] if n_draws else NULL
    with nogil:
        cpp_sample_tokens(device, lp, vocab, sp, n_seen, temperature, top_k, top_p, min_p, repeat_penalty, extras,
                          dp, n_draws, graph, argmax_path, tp)
    return tokens


def time_gemv_inputs(weight, int max_inputs, int reps=20, int device=0, str kernel="chosen") -> tuple:
    """Median seconds of GEMVs of `weight` (as gemv_inputs takes it) with 1..max_inputs activations and a cold L2,
    as two float64 arrays [max_inputs]: a batch of i products of the weight (each reading it again), and one
    multi-input launch (each block read once for every input) by `kernel` (as gemv_inputs takes it)."""
    cdef int kernel_id = _inputs_kernel(kernel)
    cdef QuantForm form
    cdef QuantPlanes planes
    cdef FloatKind kind
    cdef const unsigned char[::1] wv
    cdef int rows, cols
    keep = []
    rows, cols, float_bytes = _gemv_weight(weight, &form, &planes, &kind, keep)
    if float_bytes is not None and kernel != "chosen":
        raise InvalidArgument(f"time_gemv_inputs: a float weight has one kernel; {kernel!r} is the quantized forms'")
    batch = np.zeros(max(max_inputs, 1), np.float64)
    inputs = np.zeros(max(max_inputs, 1), np.float64)
    cdef double[::1] bv = batch
    cdef double[::1] iv = inputs
    if float_bytes is not None:
        wv = float_bytes
        with nogil:
            cpp_time_gemv_float_inputs(device, kind, &wv[0], rows, cols, max_inputs, reps, &bv[0], &iv[0])
    else:
        with nogil:
            cpp_time_gemv_quant_inputs(device, form, planes, rows, cols, max_inputs, reps, &bv[0], &iv[0],
                                       kernel_id)
    return batch, inputs


def time_gemv_batch(stack, int n_matrix, int count, int split=0, int reps=20, int device=0) -> float:
    """Median seconds of one batch of `count` products over a stack (a QuantTensor of n_matrix matrices, as
    gemv_batch takes it; product j of matrix j % n_matrix, each its own x) with a cold L2, each weight row read by
    `split` warps (0: the kernels' rule, else 1, 2 or 4)."""
    cdef QuantForm form
    cdef QuantPlanes planes
    cdef FloatKind kind
    cdef double seconds
    cdef int stack_rows, cols, rows
    keep = []
    stack_rows, cols, float_bytes = _gemv_weight(stack, &form, &planes, &kind, keep)
    if float_bytes is not None:
        raise InvalidArgument("time_gemv_batch: times quantized stacks; this one is float")
    if n_matrix < 1 or stack_rows % n_matrix:
        raise InvalidArgument(f"time_gemv_batch: a stack of {stack_rows} rows is not {n_matrix} matrices of equal rows")
    rows = stack_rows // n_matrix
    with nogil:
        seconds = cpp_time_gemv_quant_batch(device, form, planes, n_matrix, rows, cols, count, split, reps)
    return seconds
