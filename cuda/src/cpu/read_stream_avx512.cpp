// The read test's pass with 64-byte loads (read_stream.inl); compiled with AVX-512.
#include <cstdint>

#include "read_bandwidth.hpp"

namespace strata::cpu {
namespace {
typedef long long Vec __attribute__((vector_size(64)));
#include "read_stream.inl"
}  // namespace

uint64_t read_slice_avx512(const uint8_t* slice, int64_t bytes, bool prefetch) {
  return read_streams(slice, bytes, prefetch);
}

}  // namespace strata::cpu
