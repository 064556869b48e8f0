# GEMVs over uploaded weights through the decode-step kernels (strata::weights_check).
from libcpp.string cimport string

from strata._native cimport DeviceWeights
from strata.libstrata.check.weights_check cimport cpp_weights_gemv
from strata.libstrata.device_weights cimport DeviceTensor


def weights_gemv(DeviceWeights weights, str name, x):
    """W x for the uploaded tensor `name` through the decode-step GEMV kernels (quantized forms take x as q8_32)."""
    cdef string key = name.encode()
    cdef const DeviceTensor* t = &weights.weights.get().get(key)
    cdef const float[::1] xv = np.ascontiguousarray(x, dtype=np.float32)
    if xv.shape[0] != t.cols:
        raise InvalidArgument(f"gemv of {name}: x has {xv.shape[0]} entries, the tensor has {t.cols} columns")
    out = np.empty(t.rows, np.float32)
    cdef float[::1] ov = out
    with nogil:
        cpp_weights_gemv(weights.weights.get()[0], key, &xv[0], &ov[0])
    return out
