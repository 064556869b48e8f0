# Kernel families' host round trips (strata::kernel_check): each uploads its inputs, runs one kernel into a
# poisoned, guarded output and copies it back. For tests and benchmarks, not the token path.
from libc.stdint cimport int8_t, int32_t, uint8_t, uint16_t

from _native_kernels cimport Codebook, FloatKind, QuantForm, QuantPlanes

cdef extern from "strata/kernel_check.hpp" nogil:
    void cpp_quantize_q8_32 "strata::kernel_check::quantize_q8_32"(
        int device, const float* x, long n, int8_t* xq, float* dx, int32_t* sums) except +raise_strata_error
    void cpp_gemv_quant "strata::kernel_check::gemv_quant"(
        int device, const QuantForm& form, const QuantPlanes& planes, int rows, int cols, const float* x,
        float* y) except +raise_strata_error
    void cpp_gemv_float "strata::kernel_check::gemv_float"(
        int device, FloatKind kind, const void* w, int rows, int cols, const float* x,
        float* y) except +raise_strata_error
    double cpp_time_gemv_quant "strata::kernel_check::time_gemv_quant"(
        int device, const QuantForm& form, const QuantPlanes& planes, int rows, int cols,
        int reps) except +raise_strata_error
    double cpp_time_gemv_float "strata::kernel_check::time_gemv_float"(
        int device, FloatKind kind, const void* w, int rows, int cols, int reps) except +raise_strata_error

# numpy dtype of a float weight -> its FloatKind; bf16 travels as its raw uint16 bits (as strata.quant holds it).
_FLOAT_KINDS = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, np.dtype(np.uint16): 2}


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


cdef QuantForm _quant_form(form) except *:
    from strata.quant.forms import IQ4_NL_CODEBOOK, MXFP4_CODEBOOK

    cdef QuantForm f
    f.code_bits = form.code_bits
    f.code_bias = form.code_bias
    if form.codebook is None:
        f.codebook = <Codebook>0  # Codebook::None (a Python keyword, so not declared by name)
    elif tuple(form.codebook) == IQ4_NL_CODEBOOK:
        f.codebook = Codebook.Iq4Nl
    elif tuple(form.codebook) == MXFP4_CODEBOOK:
        f.codebook = Codebook.Mxfp4
    else:
        raise InvalidArgument(f"form {form.name}: codebook {form.codebook} is neither IQ4_NL's nor MXFP4's")
    f.group_size = form.group_size
    f.super_size = form.super_size
    f.scale_f32 = form.scale_dtype == "float32"
    f.has_sub_scales = form.has_sub_scales
    f.has_mins = form.has_mins
    return f


cdef const void* _plane_pointer(plane, keep: list) except? NULL:
    """Address of a C-contiguous plane (NULL for None); the array is kept alive in `keep`."""
    if plane is None:
        return NULL
    arr = np.ascontiguousarray(plane)
    keep.append(arr)
    cdef const unsigned char[::1] bytes_view = arr.reshape(-1).view(np.uint8)
    return &bytes_view[0]


cdef QuantPlanes _quant_planes(weight, keep: list) except *:
    cdef QuantPlanes p
    p.codes = <const uint8_t*>_plane_pointer(weight.codes, keep)
    p.d = _plane_pointer(weight.d, keep)
    p.sub_scales = <const int8_t*>_plane_pointer(weight.sub_scales, keep)
    p.mins = <const uint16_t*>_plane_pointer(weight.mins, keep)
    p.sub_mins = <const uint8_t*>_plane_pointer(weight.sub_mins, keep)
    return p


cdef FloatKind _float_kind(w) except *:
    kind = _FLOAT_KINDS.get(w.dtype)
    if kind is None or w.ndim != 2:
        raise InvalidArgument(f"gemv: a float weight must be a 2-D float32, float16 or uint16 (bf16 bits) array; "
                              f"found {w.dtype}{list(w.shape)}")
    return <FloatKind>kind


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
    if isinstance(weight, np.ndarray):
        kind = _float_kind(weight)
        rows, cols = weight.shape
        warr = np.ascontiguousarray(weight)
        wv = warr.reshape(-1).view(np.uint8)
    else:
        form = _quant_form(weight.form)
        planes = _quant_planes(weight, keep)
        rows, cols = weight.rows, weight.cols
    if xv.shape[0] != cols:
        raise InvalidArgument(f"gemv: x has {xv.shape[0]} elements, the weight has {cols} columns")
    y = np.empty(rows, np.float32)
    cdef float[::1] yv = y
    if isinstance(weight, np.ndarray):
        with nogil:
            cpp_gemv_float(device, kind, &wv[0], rows, cols, &xv[0], &yv[0])
    else:
        with nogil:
            cpp_gemv_quant(device, form, planes, rows, cols, &xv[0], &yv[0])
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
    if isinstance(weight, np.ndarray):
        kind = _float_kind(weight)
        rows, cols = weight.shape
        warr = np.ascontiguousarray(weight)
        wv = warr.reshape(-1).view(np.uint8)
        with nogil:
            seconds = cpp_time_gemv_float(device, kind, &wv[0], rows, cols, reps)
    else:
        form = _quant_form(weight.form)
        planes = _quant_planes(weight, keep)
        rows, cols = weight.rows, weight.cols
        with nogil:
            seconds = cpp_time_gemv_quant(device, form, planes, rows, cols, reps)
    return seconds


cdef extern from "strata/kernel_check.hpp" nogil:
    void cpp_rms_norm_grouped "strata::kernel_check::rms_norm_grouped"(
        int device, const float* x, const float* w, float* y, int rows, int groups, int cols,
        float eps) except +raise_strata_error
    void cpp_rms_norm_gated "strata::kernel_check::rms_norm_gated"(
        int device, const float* x, const float* z, const float* w, float* y, int heads, int head_dim, float eps,
        const string& gate) except +raise_strata_error
    void cpp_l2_norm "strata::kernel_check::l2_norm"(
        int device, const float* x, float* y, int heads, int head_dim, float eps) except +raise_strata_error
    void cpp_rope_neox "strata::kernel_check::rope_neox"(
        int device, const float* x, const int32_t* positions, float* y, int tokens, int heads, int head_dim,
        int rope_dim, double theta) except +raise_strata_error


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


def rms_norm_gated(x, z, w, float eps, str gate="sigmoid", int device=0):
    """Per head (rows of x, z [heads, head_dim]): rms_norm(x) * w * gate(z), gate 'sigmoid' or 'silu'."""
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
    with nogil:
        cpp_rms_norm_gated(device, &xv[0, 0], &zv[0, 0], &wv[0], &yv[0, 0], heads, head_dim, eps, g)
    return out


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


cdef extern from "strata/kernel_check.hpp" nogil:
    void cpp_moe_route "strata::kernel_check::moe_route"(
        int device, const float* logits, int tokens, int n_expert, int k, int32_t* ids,
        float* weights) except +raise_strata_error
    float cpp_shared_expert_gate "strata::kernel_check::shared_expert_gate"(
        int device, const float* w, const float* x, int n) except +raise_strata_error
    void cpp_swiglu "strata::kernel_check::swiglu"(
        int device, const float* g, const float* u, float* h, int n) except +raise_strata_error
    void cpp_moe_combine "strata::kernel_check::moe_combine"(
        int device, const float* routed, const float* shared, float gate, float* out, int n) except +raise_strata_error


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


cdef extern from "strata/kernel_check.hpp" nogil:
    cdef cppclass HcReadOutputs "strata::kernel_check::HcReadOutputs":
        float* normed
        float* low
        float* x
        float* inj
    void cpp_hc_read "strata::kernel_check::hc_read"(
        int device, const float* h, const float* norm, int streams, int n, float eps, const HostTensor& down,
        const HostTensor& up, const HostTensor* inject, const HcReadOutputs& out) except +raise_strata_error
    void cpp_hc_write "strata::kernel_check::hc_write"(
        int device, const float* h, const float* inj, const float* y, float* h_out, int streams,
        int n) except +raise_strata_error


def hc_read(streams, norm, down, up, inject=None, *, float eps, int device=0) -> dict:
    """The hyper-connection read of streams H [hc, n] (shared/docs/models/qwen4exp.md §3(a)) on the device.

    norm: float32 [hc * n]; down, up, inject: weights as strata.quant holds them (QuantTensor or float array),
    down [rank, hc*n], up [hc*n, rank], inject [hc, hc*n] or None (the final mixer). Returns the stages:
    normed [hc * n], low [rank], x [n] and, with inject, inj [hc].
    """
    cdef const float[:, ::1] hv = _rows_f32(streams, "hc_read (streams)")
    cdef int hc = hv.shape[0], n = hv.shape[1]
    cdef const float[::1] nv = _vector_f32(norm, "hc_read (norm)", hc * n)
    keep = []
    cdef HostTensor t_down = _host_tensor("down", down, keep)
    cdef HostTensor t_up = _host_tensor("up", up, keep)
    cdef HostTensor t_inject
    cdef const HostTensor* p_inject = NULL
    if inject is not None:
        t_inject = _host_tensor("inject", inject, keep)
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


cdef extern from "strata/kernel_check.hpp" nogil:
    void cpp_sample_tokens "strata::kernel_check::sample_tokens"(
        int device, const float* logits, int vocab, const int32_t* seen, int n_seen, double temperature,
        int top_k, double top_p, double min_p, double repeat_penalty, const double* draws, int n_draws,
        bint graph, int32_t* tokens) except +raise_strata_error


def sample_tokens(logits, params, draws, seen=(), bint graph=False, int device=0):
    """The token strata.sampling.sample(logits, params, u, seen) picks for each u in `draws`, on GPU `device`.

    `params` is a strata.sampling.SamplingParams; returns int32 [len(draws)]. With graph=True the sampler is
    captured once into a CUDA graph and replayed per draw, the values rewritten in device memory in between.
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
    tokens = np.empty(n_draws, np.int32)
    cdef int32_t[::1] tv = tokens
    # Empty inputs pass NULL; the native checks refuse them before reading.
    cdef const float* lp = &lv[0] if vocab else NULL
    cdef const int32_t* sp = &sv[0] if n_seen else NULL
    cdef const double* dp = &dv[0] if n_draws else NULL
    cdef int32_t* tp = &tv[0] if n_draws else NULL
    with nogil:
        cpp_sample_tokens(device, lp, vocab, sp, n_seen, temperature, top_k, top_p, min_p, repeat_penalty, dp,
                          n_draws, graph, tp)
    return tokens
