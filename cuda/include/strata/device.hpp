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

// CUDA driver and runtime versions as 1000*major + 10*minor; the driver's is 0 when there is none.
int driver_version() noexcept;
int runtime_version() noexcept;

}  // namespace strata
