# Norm and RoPE kernels: host round trips (strata::kernel_check). Each uploads its inputs, runs one
# kernel into a poisoned, guarded output and copies it back: for tests and benchmarks, not the token path.
from libc.stdint cimport int32_t
from libcpp.string cimport string

from strata._native_check_kernels cimport cpp_l2_norm, cpp_rms_norm_gated, cpp_rms_norm_grouped, cpp_rope_neox

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
