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
