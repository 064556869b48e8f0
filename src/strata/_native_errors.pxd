# The `except +` handler of every native call (see _native_errors.hpp). Pure extern: any room's .pxd may
# cimport it without making a module import anything at load time.

cdef extern from "_native_errors.hpp" namespace "strata_binding":
    int raise_strata_error() except -1
