// An owned non-blocking CUDA stream; destruction waits for its work first, so buffers freed after it are idle.
#pragma once

#include <cuda_runtime_api.h>

#include "strata/error.hpp"

namespace strata {

class Stream {
 public:
  Stream() { STRATA_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
  cudaStream_t get() const noexcept { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace strata
