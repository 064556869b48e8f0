# A table's rows read from the model file as they are needed (strata::FileRows): the PLE layer's n-gram table,
# which strata.runtime.ple_rows reads through one, and PleGather through another.
import os

from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memcpy
from libcpp.memory cimport unique_ptr
from libcpp.string cimport string

from strata.libstrata.file_rows cimport CppFileRows


cdef class FileRows:
    """`rows` rows of `row_bytes` bytes from byte `offset` of the file at `path`, read as they are needed (buffered,
    readahead off) with the last `cache_rows` kept; `what` names the table in errors."""

    def __cinit__(self, str path, int64_t offset, int64_t rows, size_t row_bytes, int cache_rows=4096,
                  str what="table"):
        cdef string cpath = os.fsencode(path)
        cdef string cwhat = what.encode()
        with nogil:
            self.rows.reset(new CppFileRows(cpath, offset, rows, row_bytes, cache_rows, cwhat))

    def gather(self, indices):
        """uint8 [len(indices), row_bytes]: those rows, in order. FormatError when the file ended before one or
        changed since it was opened."""
        cdef const int64_t[::1] ids = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        cdef CppFileRows* rows = self.rows.get()
        cdef size_t width = rows.row_bytes()
        out = np.empty((ids.shape[0], width), np.uint8)
        cdef uint8_t[:, ::1] view = out
        cdef Py_ssize_t i
        with nogil:
            for i in range(ids.shape[0]):
                memcpy(&view[i, 0], rows.row(ids[i]), width)
            rows.check_read()
        return out

    @property
    def n_rows(self) -> int:
        return self.rows.get().rows()

    @property
    def row_bytes(self) -> int:
        return self.rows.get().row_bytes()

    @property
    def hits(self) -> int:
        """Rows found in the cache."""
        return self.rows.get().hits()

    @property
    def misses(self) -> int:
        """Rows read from the file."""
        return self.rows.get().misses()
