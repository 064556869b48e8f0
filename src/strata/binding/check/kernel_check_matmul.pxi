# Round trips of the matrix products (strata::kernel_check, kernel_check_matmul.hpp), dense or in groups over a
# stack of matrices, and their timing. For tests and benchmarks only.
from libc.stdint cimport int32_t

from strata.libstrata.check.kernel_check_matmul cimport (
    MatmulCheckRows, cpp_matmul_float, cpp_matmul_quant, cpp_time_matmul_float, cpp_time_matmul_quant,
)
from strata.libstrata.forms cimport FloatKind, QuantForm, QuantPlanes


cdef object _matmul(stack, int n_matrix, slots, begin, x, int y_stride, int device):
    """The product of matmul / matmul_grouped (slots and begin None: dense)."""
    cdef QuantForm form
    cdef QuantPlanes planes
    cdef FloatKind kind
    cdef const unsigned char[::1] wv
    cdef MatmulCheckRows rows_of_x
    cdef int stack_rows, cols, rows
    keep = []
    stack_rows, cols, float_bytes = _gemv_weight(stack, &form, &planes, &kind, keep)
    if n_matrix < 1 or stack_rows % n_matrix:
        raise InvalidArgument(f"matmul: a stack of {stack_rows} rows is not {n_matrix} matrices of equal rows")
    rows = stack_rows // n_matrix
    xa = np.ascontiguousarray(x, dtype=np.float32)
    if xa.ndim != 2 or xa.size == 0:
        raise InvalidArgument(f"matmul: x has shape {xa.shape}; expected (rows of x, x_stride >= {cols})")
    rows_of_x.count = xa.shape[0]
    rows_of_x.x_stride = xa.shape[1]
    rows_of_x.y_stride = y_stride if y_stride else rows
    cdef const int32_t[::1] sv
    cdef const int32_t[::1] bv
    rows_of_x.groups = 0
    if slots is not None:
        sa = np.ascontiguousarray(slots, dtype=np.int32).reshape(-1)
        ba = np.ascontiguousarray(begin, dtype=np.int32).reshape(-1)
        if sa.size == 0 or ba.size != sa.size + 1:
            raise InvalidArgument(f"matmul_grouped: {sa.size} slots need {sa.size + 1} begin entries, got {ba.size}")
        sv, bv = sa, ba
        rows_of_x.slots = &sv[0]
        rows_of_x.begin = &bv[0]
        rows_of_x.groups = sa.size
    cdef const float[::1] xv = xa.reshape(-1)
    y = np.empty((rows_of_x.count, rows_of_x.y_stride), np.float32)
    cdef float[::1] yv = y.reshape(-1)
    if float_bytes is not None:
        wv = float_bytes
        with nogil:
            cpp_matmul_float(device, kind, &wv[0], n_matrix, rows, cols, rows_of_x, &xv[0], &yv[0])
    else:
        with nogil:
            cpp_matmul_quant(device, form, planes, n_matrix, rows, cols, rows_of_x, &xv[0], &yv[0])
    return y


def matmul(weight, x, int y_stride=0, int device=0):
    """y = x W^T on GPU `device`: float32 [rows of x, y_stride] (y_stride 0: the weight's rows), the product in
    each row's first `rows` entries, the rest the poison (NaN) the hook fills y with.

    `weight` as gemv takes it (a QuantTensor, whose x is quantized to q8_32 on the device, or a float array).
    x: float32 [rows of x, x_stride], x_stride >= cols (a multiple of 32 for a QuantTensor); each row's first cols
    are the activation.
    """
    return _matmul(weight, 1, None, None, x, y_stride, device)


def matmul_grouped(stack, int n_matrix, slots, begin, x, int y_stride=0, int device=0):
    """The grouped product over a stack of n_matrix matrices (as gemv_batch takes it): rows begin[g] ..
    begin[g + 1] - 1 of y are those rows of x times matrix slots[g]; a negative slot skips its group. Rows no
    group writes come back NaN. x and y as matmul's; the native hook checks slots and begin first.
    """
    return _matmul(stack, n_matrix, slots, begin, x, y_stride, device)


def time_matmul(stack, int n_matrix, int count, int groups=0, int reps=20, int device=0) -> float:
    """Median seconds of one product of `count` rows with a warm L2: dense with groups 0 (matrix 0 of the stack),
    else `groups` equal groups of count / groups rows, group g times matrix g % n_matrix."""
    cdef QuantForm form
    cdef QuantPlanes planes
    cdef FloatKind kind
    cdef const unsigned char[::1] wv
    cdef double seconds
    cdef int stack_rows, cols, rows
    keep = []
    stack_rows, cols, float_bytes = _gemv_weight(stack, &form, &planes, &kind, keep)
    if n_matrix < 1 or stack_rows % n_matrix:
        raise InvalidArgument(f"time_matmul: a stack of {stack_rows} rows is not {n_matrix} matrices of equal rows")
    rows = stack_rows // n_matrix
    if float_bytes is not None:
        wv = float_bytes
        with nogil:
            seconds = cpp_time_matmul_float(device, kind, &wv[0], n_matrix, rows, cols, count, groups, reps)
    else:
        with nogil:
            seconds = cpp_time_matmul_quant(device, form, planes, n_matrix, rows, cols, count, groups, reps)
    return seconds
