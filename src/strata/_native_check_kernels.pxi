# Kernel families' host round trips (strata::kernel_check): each uploads its inputs, runs one kernel into a
# poisoned, guarded output and copies it back. For tests and benchmarks, not the token path.
from libc.stdint cimport int8_t, int32_t

from strata._native cimport float_kind, quant_form, quant_planes
from strata._native_check_kernels cimport (
    cpp_gemv_float, cpp_gemv_quant, cpp_quantize_q8_32, cpp_time_gemv_float, cpp_time_gemv_quant,
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
        kind = float_kind(weight)
        rows, cols = weight.shape
        warr = np.ascontiguousarray(weight)
        wv = warr.reshape(-1).view(np.uint8)
    else:
        form = quant_form(weight.form)
        planes = quant_planes(weight, keep)
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
        kind = float_kind(weight)
        rows, cols = weight.shape
        warr = np.ascontiguousarray(weight)
        wv = warr.reshape(-1).view(np.uint8)
        with nogil:
            seconds = cpp_time_gemv_float(device, kind, &wv[0], rows, cols, reps)
    else:
        form = quant_form(weight.form)
        planes = quant_planes(weight, keep)
        rows, cols = weight.rows, weight.cols
        with nogil:
            seconds = cpp_time_gemv_quant(device, form, planes, rows, cols, reps)
    return seconds
