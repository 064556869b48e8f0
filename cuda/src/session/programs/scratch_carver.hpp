// Hands out 256-byte aligned pieces of one allocation: a first pass over a null base sizes it, so that the
// programs' scratch and the memory plan read one definition of each buffer.
#pragma once

#include <algorithm>
#include <cstddef>

namespace strata {

class Carver {
 public:
  static constexpr std::size_t kAlign = 256;
  explicit Carver(char* base) : base_(base) {}
  template <class T>
  T* take(std::size_t count) {
    const std::size_t at = used_;
    used_ += (std::max<std::size_t>(count * sizeof(T), 1) + kAlign - 1) / kAlign * kAlign;
    return base_ ? reinterpret_cast<T*>(base_ + at) : nullptr;
  }
  std::size_t used() const noexcept { return used_; }

 private:
  char* base_;
  std::size_t used_ = 0;
};

}  // namespace strata
