// What the machine a model runs on moves, measured where it runs: the rates `strata bench` divides a token's
// bytes by. Host-only header; every call allocates and synchronises, so none belongs on a session's path.
#pragma once

#include <cstdint>

namespace strata {

// Best bytes/s of `reps` copies of `bytes` from page-locked host memory into `device`'s memory (after one
// untimed copy). InvalidArgument for bytes or reps < 1.
double pinned_upload_rate(int device, std::int64_t bytes, int reps);

// Best bytes/s of HBM traffic of `reps` device-to-device copies of `bytes` on `device` (after one untimed copy):
// a copy reads and writes every byte, so each counts 2 * bytes, the traffic a weight read at HBM speed sees.
// InvalidArgument for bytes or reps < 1.
double device_copy_rate(int device, std::int64_t bytes, int reps);

// Median seconds of one doorbell round trip on `device`, over `rounds` round trips after a warm-up: a kernel
// writes a ring number into mapped pinned memory, this thread spinning on it writes the number back, the kernel
// sees it and rings the next. Throws Error when a ring is not seen within a second. InvalidArgument for
// rounds < 1.
double doorbell_round_trip(int device, int rounds);

}  // namespace strata
