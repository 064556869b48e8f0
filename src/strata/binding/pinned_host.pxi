# Page-locked host floats as numpy arrays' memory (strata/pinned_host.hpp): where the GPU engine has the device copy
# what it hands the host in bulk (a verification's rows of logits), at the bus's rate.
from libcpp.memory cimport unique_ptr

from strata.libstrata.pinned_host cimport CppPinnedHost


cdef class PinnedFloats:
    """rows x cols float32 of page-locked host memory, zeroed: np.asarray(it) is a C-contiguous float32 array over
    it, which keeps it alive."""

    cdef unique_ptr[CppPinnedHost] memory
    cdef Py_ssize_t shape[2]
    cdef Py_ssize_t strides[2]

    def __cinit__(self, Py_ssize_t rows, Py_ssize_t cols):
        if rows < 1 or cols < 1:
            raise InvalidArgument(f"a page-locked block of {rows} x {cols} floats: both must be at least 1")
        self.memory.reset(new CppPinnedHost(<size_t>(rows * cols * sizeof(float))))
        self.shape[0], self.shape[1] = rows, cols
        self.strides[0], self.strides[1] = cols * sizeof(float), sizeof(float)

    def __getbuffer__(self, Py_buffer* buffer, int flags):
        buffer.buf = self.memory.get().data()
        buffer.format = "f"
        buffer.internal = NULL
        buffer.itemsize = sizeof(float)
        buffer.len = self.shape[0] * self.shape[1] * sizeof(float)
        buffer.ndim = 2
        buffer.obj = self
        buffer.readonly = 0
        buffer.shape = self.shape
        buffer.strides = self.strides
        buffer.suboffsets = NULL

    def __releasebuffer__(self, Py_buffer* buffer):
        pass
