// The read test's pass with 32-byte loads (read_stream.inl); compiled with AVX2.
#include <cstdint>

#include "read_bandwidth.hpp"

namespace strata::cpu {
namespace {
typedef long long Vec __attribute__((vector_size(32)));
#include "read_stream.inl"
}  // namespace

uint64_t read_slice_avx2(const uint8_t* slice, int64_t bytes, bool prefetch) {
  return read_streams(slice, bytes, prefetch);
}

}  // namespace strata::cpu
