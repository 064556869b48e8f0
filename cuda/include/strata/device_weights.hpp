// A model's dense weights in VRAM: one allocation sized exactly, every tensor in its canonical form
// (docs/forms.md), looked up by GGUF name. Host-only header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "strata/forms.hpp"

namespace strata {

// One tensor as the loader hands it over: host pointers to its planes (float forms: `codes` holds the data).
struct HostTensor {
  std::string name;
  bool is_float = false;
  FloatKind float_kind = FloatKind::F32;
  QuantForm form;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  const void* planes[5] = {};       // codes (or float data), d, sub_scales, mins, sub_mins
  std::size_t plane_bytes[5] = {};  // 0 for a plane the form lacks
};

// A tensor in VRAM.
struct DeviceTensor {
  bool is_float = false;
  FloatKind float_kind = FloatKind::F32;
  const void* data = nullptr;  // float forms
  QuantForm form;
  QuantPlanes planes;          // quantized forms
  std::int64_t rows = 0;
  std::int64_t cols = 0;
};

// Every plane in VRAM starts on a 256-byte boundary (vector loads, TMA): the bytes a plane of `bytes` takes.
constexpr std::size_t kPlaneAlign = 256;
constexpr std::size_t plane_aligned(std::size_t bytes) noexcept {
  return (bytes + kPlaneAlign - 1) / kPlaneAlign * kPlaneAlign;
}

// A tensor in VRAM whose planes were placed at `planes`, in HostTensor's order (codes or the float data, d,
// sub_scales, mins, sub_mins; nullptr for a plane the form lacks), and plane i of it in that order.
DeviceTensor placed_tensor(bool is_float, FloatKind float_kind, const QuantForm& form, std::int64_t rows,
                           std::int64_t cols, const void* const planes[5]);
const void* plane_of(const DeviceTensor& t, int i);

class DeviceWeights {
 public:
  // Validates every tensor's plane sizes against its form and shape (InvalidArgument naming the tensor),
  // then makes one allocation on `device` and copies every plane, 256-byte aligned.
  DeviceWeights(int device, const std::vector<HostTensor>& tensors);
  ~DeviceWeights();
  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;

  const DeviceTensor& get(const std::string& name) const;  // InvalidArgument naming a missing tensor
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  std::size_t bytes() const noexcept { return bytes_; }
  int device() const noexcept { return device_; }

 private:
  int device_;
  std::size_t bytes_ = 0;
  void* arena_ = nullptr;
  std::unordered_map<std::string, DeviceTensor> tensors_;
};

}  // namespace strata
