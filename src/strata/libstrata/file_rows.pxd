# Declarations of a table's rows read from the model file as needed (cuda/include/strata/file_rows.hpp).
from libc.stdint cimport int64_t, uint8_t
from libcpp.string cimport string

from strata.binding.errors cimport raise_strata_error


cdef extern from "strata/file_rows.hpp" nogil:
    cdef cppclass CppFileRows "strata::FileRows":
        CppFileRows(const string& path, int64_t offset, int64_t rows, size_t row_bytes, int cache_rows,
                    const string& what) except +raise_strata_error
        int64_t rows()
        size_t row_bytes()
        const uint8_t* row(int64_t row) except +raise_strata_error
        void check_read() except +raise_strata_error
        int64_t hits()
        int64_t misses()
