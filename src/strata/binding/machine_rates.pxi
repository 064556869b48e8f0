# The machine's rates, measured where it runs (strata::pinned_upload_rate, device_copy_rate, doorbell_round_trip):
# what strata.bench's limit divides a token's bytes by.
from libc.stdint cimport int64_t

from strata.libstrata.machine_rates cimport (
    cpp_device_copy_rate, cpp_doorbell_round_trip, cpp_pinned_upload_rate,
)


def pinned_upload_rate(int device, int64_t nbytes, int reps=5) -> float:
    """Best bytes/s of `reps` copies of `nbytes` from page-locked host memory to GPU `device` (PCIe)."""
    cdef double rate
    with nogil:
        rate = cpp_pinned_upload_rate(device, nbytes, reps)
    return rate


def device_copy_rate(int device, int64_t nbytes, int reps=5) -> float:
    """Best bytes/s of HBM traffic of `reps` device-to-device copies of `nbytes` on GPU `device`: a copy reads
    and writes every byte, so each counts 2 * nbytes."""
    cdef double rate
    with nogil:
        rate = cpp_device_copy_rate(device, nbytes, reps)
    return rate


def doorbell_round_trip(int device, int rounds=1000) -> float:
    """Median seconds of one doorbell round trip on GPU `device` (the GPU rings through mapped pinned memory, the
    host answers, the GPU sees the answer) over `rounds` round trips after a warm-up."""
    cdef double seconds
    with nogil:
        seconds = cpp_doorbell_round_trip(device, rounds)
    return seconds
