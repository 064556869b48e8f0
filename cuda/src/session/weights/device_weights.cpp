#include "strata/device_weights.hpp"

#include <cuda_runtime_api.h>

#include "../../runtime/device_buffer.hpp"
#include "strata/device.hpp"
#include "strata/error.hpp"

namespace strata {
namespace {

constexpr const char* kPlaneNames[5] = {"codes", "d", "sub_scales", "mins", "sub_mins"};


// What each plane of `t` must hold, from its form and shape alone.
void expected_bytes(const HostTensor& t, std::size_t out[5]) {
  for (int i = 0; i < 5; ++i) out[i] = 0;
  if (t.is_float) {
    out[0] = static_cast<std::size_t>(t.rows) * t.cols * float_kind_bytes(t.float_kind);
    return;
  }
  const PlaneBytes b = plane_bytes(t.form, t.rows, t.cols);
  out[0] = b.codes;
  out[1] = b.d;
  out[2] = b.sub_scales;
  out[3] = b.mins;
  out[4] = b.sub_mins;
}

void validate(const HostTensor& t) {
  STRATA_EXPECTS(t.rows > 0 && t.cols > 0, InvalidArgument,
                 "tensor " + t.name + ": shape " + std::to_string(t.rows) + " x " + std::to_string(t.cols));
  if (!t.is_float) {
    const QuantForm& f = t.form;
    STRATA_EXPECTS((f.code_bits == 2 || f.code_bits == 4 || f.code_bits == 8) && f.super_size > 0 &&
                       f.group_size > 0 && f.super_size % f.group_size == 0 && t.cols % f.super_size == 0,
                   InvalidArgument,
                   "tensor " + t.name + ": form (code_bits " + std::to_string(f.code_bits) + ", super " +
                       std::to_string(f.super_size) + ") does not fit " + std::to_string(t.cols) + " columns");
  }
  std::size_t want[5];
  expected_bytes(t, want);
  for (int i = 0; i < 5; ++i) {
    STRATA_EXPECTS(t.plane_bytes[i] == want[i] && (want[i] == 0 || t.planes[i] != nullptr), InvalidArgument,
                   "tensor " + t.name + ": plane " + kPlaneNames[i] + " has " + std::to_string(t.plane_bytes[i]) +
                       " bytes, its form and shape need " + std::to_string(want[i]));
  }
}

}  // namespace

DeviceTensor placed_tensor(bool is_float, FloatKind float_kind, const QuantForm& form, std::int64_t rows,
                           std::int64_t cols, const void* const planes[5]) {
  DeviceTensor d;
  d.is_float = is_float;
  d.float_kind = float_kind;
  d.form = form;
  d.rows = rows;
  d.cols = cols;
  d.data = planes[0];
  d.planes = QuantPlanes{static_cast<const std::uint8_t*>(planes[0]), planes[1],
                         static_cast<const std::int8_t*>(planes[2]), static_cast<const std::uint16_t*>(planes[3]),
                         static_cast<const std::uint8_t*>(planes[4])};
  return d;
}

const void* plane_of(const DeviceTensor& t, int i) {
  const void* all[5] = {t.planes.codes, t.planes.d, t.planes.sub_scales, t.planes.mins, t.planes.sub_mins};
  return all[i];
}

DeviceWeights::DeviceWeights(int device, const std::vector<HostTensor>& tensors) : device_(device) {
  for (const HostTensor& t : tensors) {
    validate(t);
    STRATA_EXPECTS(!tensors_.count(t.name), InvalidArgument, "tensor " + t.name + " given twice");
    tensors_.emplace(t.name, DeviceTensor{});
    for (std::size_t b : t.plane_bytes) bytes_ += plane_aligned(b);
  }
  require_device(device);
  DeviceScope scope(device);
  require_free_memory(bytes_, device, "the dense weights");
  STRATA_CUDA_TRY(cudaMalloc(&arena_, bytes_ ? bytes_ : 1));
  try {
    char* cursor = static_cast<char*>(arena_);
    for (const HostTensor& t : tensors) {
      const void* placed[5] = {};
      for (int i = 0; i < 5; ++i) {
        if (t.plane_bytes[i] == 0) continue;
        STRATA_CUDA_TRY(cudaMemcpy(cursor, t.planes[i], t.plane_bytes[i], cudaMemcpyHostToDevice));
        placed[i] = cursor;
        cursor += plane_aligned(t.plane_bytes[i]);
      }
      tensors_.at(t.name) = placed_tensor(t.is_float, t.float_kind, t.form, t.rows, t.cols, placed);
    }
  } catch (...) {
    (void)cudaFree(arena_);
    throw;
  }
}

DeviceWeights::~DeviceWeights() {
  if (arena_) (void)cudaFree(arena_);
}

const DeviceTensor& DeviceWeights::get(const std::string& name) const {
  const auto it = tensors_.find(name);
  STRATA_EXPECTS(it != tensors_.end(), InvalidArgument, "no tensor named " + name + " among the device weights");
  return it->second;
}

}  // namespace strata
