# The `except +` handler of every native call (see errors.hpp). Pure extern: any header's .pxd may cimport it
# without making a module import anything at load time.

cdef extern from "strata/binding/errors.hpp" namespace "strata_binding":
    int raise_strata_error() except -1
