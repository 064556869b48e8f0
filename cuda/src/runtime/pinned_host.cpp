#include "strata/pinned_host.hpp"

#include <cuda_runtime_api.h>

#include <cstring>

#include "strata/error.hpp"

namespace strata {

PinnedHost::PinnedHost(std::size_t bytes) : bytes_(bytes) {
  STRATA_EXPECTS(bytes_ > 0, InvalidArgument, "a page-locked host buffer of 0 bytes");
  STRATA_CUDA_TRY(cudaHostAlloc(&data_, bytes_, cudaHostAllocDefault));
  std::memset(data_, 0, bytes_);
}

// Freeing page-locked memory synchronises the device: an owner frees it off the token path.
PinnedHost::~PinnedHost() {
  if (data_) (void)cudaFreeHost(data_);
}

}  // namespace strata
