#include "host_region.hpp"

#include <sys/mman.h>

#include <cstring>
#include <string>
#include <utility>

#include "strata/error.hpp"

namespace strata::cpu {

HostRegion::HostRegion(std::size_t bytes, const char* what) : bytes_(bytes) {
  if (bytes == 0) return;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  STRATA_EXPECTS(p != MAP_FAILED, OutOfMemory,
                 std::string(what) + ": cannot map " + std::to_string(bytes) + " bytes of host memory");
  data_ = static_cast<std::uint8_t*>(p);
  ::madvise(data_, bytes, MADV_HUGEPAGE);  // advice only: fewer TLB misses where the kernel grants it
  locked_ = ::mlock(data_, bytes) == 0;
  if (!locked_) std::memset(data_, 0, bytes);  // mlock faults the pages in; without it, touch them
}

HostRegion::~HostRegion() { release(); }

HostRegion::HostRegion(HostRegion&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)),
      locked_(std::exchange(other.locked_, false)) {}

HostRegion& HostRegion::operator=(HostRegion&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    locked_ = std::exchange(other.locked_, false);
  }
  return *this;
}

void HostRegion::release() noexcept {
  if (data_ != nullptr) ::munmap(data_, bytes_);  // also unlocks
  data_ = nullptr;
}

}  // namespace strata::cpu
