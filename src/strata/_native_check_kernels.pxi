# Kernel families' host round trips (strata::kernel_check): each uploads its inputs, runs one kernel into a
# poisoned, guarded output and copies it back. For tests and benchmarks, not the token path.
from libc.stdint cimport int8_t, int32_t

from strata._native cimport float_kind, quant_form, quant_planes
from strata._native_check_kernels cimport (
    cpp_gemv_float, cpp_gemv_float_batch, cpp_gemv_quant, cpp_gemv_quant_batch, cpp_quantize_q8_32,
    cpp_time_gemv_float, cpp_time_gemv_quant,
)
from strata._native_forms cimport FloatKind, QuantForm, QuantPlanes


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


def gemv_batch(stack, int n_matrix, slots, x, int device=0):
    """y [count, rows] (float32), y[j] = M[slots[j]] x_j, over a stack of n_matrix matrices on GPU `device`.

    `stack` is one weight as gemv takes it, of n_matrix * rows rows: matrix m is its rows m * rows .. m * rows +
    rows - 1. slots: int [count]; a negative slot skips its product, whose row of y comes back NaN (the poison,
    never written). x: float32 [cols], read by every product (x_stride 0), or [count, x_stride], x_stride >= cols,
    product j reading row j's first cols. The native hook checks count, x_stride and the slots first.
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
            cpp_gemv_quant_batch(device, form, planes, n_matrix, rows, cols, slots_at, count, x_stride, &xv[0], y_at)
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
