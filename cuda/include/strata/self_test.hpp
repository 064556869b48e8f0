// `strata doctor`'s self-test: one kernel through the whole native chain on a device. Host-only header.
#pragma once

namespace strata {

// RMSNorm of fresh random rows on `device` (upload, kernel, download) against the same computed on the host in
// double precision; returns the largest error relative to the largest output. Allocates and synchronises.
double self_test(int device);

}  // namespace strata
