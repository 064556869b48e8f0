#include "strata/error.hpp"

#include <cuda_runtime_api.h>

#include <cstring>

namespace strata::detail {

std::string where(const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return " (" + std::string(base ? base + 1 : file) + ":" + std::to_string(line) + ")";
}

void throw_cuda_error(int code, const char* call, const char* file, int line) {
  const auto status = static_cast<cudaError_t>(code);
  // Clear the sticky-free "last error" so the next unrelated call does not report this one again.
  (void)cudaGetLastError();
  const std::string name = cudaGetErrorName(status);
  const std::string message =
      std::string(call) + " failed: " + name + ": " + cudaGetErrorString(status) + where(file, line);
  if (status == cudaErrorMemoryAllocation) throw OutOfMemory(message);
  throw CudaError(message, name);
}

}  // namespace strata::detail
