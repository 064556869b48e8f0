# Declarations of the machine's measured rates (cuda/include/strata/machine_rates.hpp).
from libc.stdint cimport int64_t

from strata.binding.errors cimport raise_strata_error


cdef extern from "strata/machine_rates.hpp" nogil:
    double cpp_pinned_upload_rate "strata::pinned_upload_rate"(int device, int64_t nbytes, int reps) \
        except +raise_strata_error
    double cpp_device_copy_rate "strata::device_copy_rate"(int device, int64_t nbytes, int reps) \
        except +raise_strata_error
    double cpp_doorbell_round_trip "strata::doorbell_round_trip"(int device, int rounds) except +raise_strata_error
