// Page-locked host memory of the disk tier (its arenas and its staging): mapped anonymous, huge pages advised,
// locked with mlock where RLIMIT_MEMLOCK allows it (locked() says whether it did), so that the experts the budget
// keeps in RAM are never paged out under memory pressure. The pages are touched here: what the tier takes shows
// in the process's resident set from the start, where the budget's test measures it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::cpu {

class HostRegion {
 public:
  HostRegion() = default;
  // Throws OutOfMemory naming `what` and the bytes when the mapping fails.
  HostRegion(std::size_t bytes, const char* what);
  ~HostRegion();
  HostRegion(HostRegion&& other) noexcept;
  HostRegion& operator=(HostRegion&& other) noexcept;
  HostRegion(const HostRegion&) = delete;
  HostRegion& operator=(const HostRegion&) = delete;

  std::uint8_t* data() const noexcept { return data_; }
  std::size_t bytes() const noexcept { return bytes_; }
  bool locked() const noexcept { return locked_; }

 private:
  void release() noexcept;

  std::uint8_t* data_ = nullptr;
  std::size_t bytes_ = 0;
  bool locked_ = false;
};

}  // namespace strata::cpu
