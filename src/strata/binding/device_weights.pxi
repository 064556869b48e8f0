# A model's dense weights in VRAM (strata::DeviceWeights), from the canonical forms strata.quant holds.
from libcpp.vector cimport vector

from strata.libstrata.device_weights cimport HostTensor


cdef HostTensor host_tensor(str name, object held, list keep) except *:
    """A strata.quant QuantTensor or float array (as repack returns them) as the core's HostTensor."""
    cdef HostTensor t
    t.name = name.encode()
    if isinstance(held, np.ndarray):
        if held.ndim != 2 or held.dtype not in _FLOAT_KINDS:
            raise InvalidArgument(f"tensor {name}: a float weight must be a 2-D float32/float16/uint16(bf16) "
                                  f"array, got {held.dtype} {held.shape}")
        t.is_float = True
        t.float_kind = <FloatKind>_FLOAT_KINDS[held.dtype]
        t.rows, t.cols = held.shape
        t.planes[0] = plane_pointer(held, keep)
        t.plane_bytes[0] = held.nbytes
        return t
    t.is_float = False
    t.form = quant_form(held.form)
    t.rows, t.cols = held.rows, held.cols
    for i, plane_name in enumerate(_PLANES):
        plane = getattr(held, plane_name)
        t.planes[i] = plane_pointer(plane, keep)
        t.plane_bytes[i] = 0 if plane is None else plane.nbytes
    return t


cdef class DeviceWeights:
    """A model's dense weights in VRAM, in canonical forms, one allocation (strata::DeviceWeights)."""

    def __cinit__(self, dict tensors, int device=0):
        cdef vector[HostTensor] host
        keep = []
        for name, held in tensors.items():
            host.push_back(host_tensor(name, held, keep))
        with nogil:
            self.weights.reset(new CppDeviceWeights(device, host))

    @property
    def nbytes(self) -> int:
        return self.weights.get().bytes()

    def __dealloc__(self):
        with nogil:
            self.weights.reset()
