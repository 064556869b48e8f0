#include "strata/check/arena_check.hpp"

#include <cuda_runtime_api.h>

#include "../runtime/device_buffer.hpp"
#include "strata/error.hpp"

namespace strata::arena_check {

void download(const SessionArena& arena, void* host) {
  DeviceScope scope(arena.device());
  STRATA_CUDA_TRY(cudaMemcpy(host, arena.data(), arena.layout().total, cudaMemcpyDeviceToHost));
}

void fill(SessionArena& arena, unsigned char byte) {
  DeviceScope scope(arena.device());
  STRATA_CUDA_TRY(cudaMemset(arena.data(), byte, arena.layout().total));
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
}

}  // namespace strata::arena_check
