// What the machine's CUDA devices are. Host-only header: safe to include from Cython.
#pragma once

#include <cstddef>
#include <string>

namespace strata {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  std::size_t total_memory = 0;  // bytes
  std::size_t free_memory = 0;   // bytes, at the time of the query
  int sm_count = 0;
};

// Number of usable CUDA devices; 0 (never an exception) when there is no driver or no GPU.
int device_count() noexcept;

// Describes device `index`; throws InvalidArgument for an index out of range, CudaError on failure.
DeviceInfo device_info(int index);

// Throws InvalidArgument unless `index` names a present device ("device index 3 out of range: 1 ...").
void require_device(int index);

// Throws OutOfMemory unless `bytes` fit in the free memory of the current device; the message says what
// `what` needs, what is free and, when given, what would need less (`hint`).
void require_free_memory(std::size_t bytes, int device, const std::string& what, const std::string& hint = "");

// CUDA driver and runtime versions as 1000*major + 10*minor; the driver's is 0 when there is none.
int driver_version() noexcept;
int runtime_version() noexcept;

}  // namespace strata
