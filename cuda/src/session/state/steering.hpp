// A sequence's control vectors (docs/control_vectors.md): the vector each steered layer's last write adds to every
// residual stream, in one device table [n_layer][n_embd], and which layers have one, known on the host. The
// programs pass a layer's vector to its FFN write only where it has one (layer_recipe.hpp), so a sequence without
// vectors runs exactly the kernels and bits it ran before they existed. New values are a copy into the same table:
// the graphs captured with it stay valid; a layer that gains or loses its vector changes a captured kernel's
// arguments, which is what `layers_changed` tells the runner (it drops its graphs then, once).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "../../runtime/device_buffer.hpp"

namespace strata {

class Steering {
 public:
  // No vectors; the table is allocated when vectors are first set (4 * n_layer * n_embd bytes on `device`).
  Steering(int device, int n_layer, int n_embd);
  Steering(const Steering&) = delete;
  Steering& operator=(const Steering&) = delete;

  // The vectors from now on: `table` [n_layer][n_embd] host floats, `layers` [n_layer] nonzero where layer l has
  // one (row l of the table; the other rows are not read and the device table holds zeros there). All layers zero:
  // no vectors. Refused (InvalidArgument naming the layer and index) before anything changes: a value that is not
  // finite. `s`, the stream whose work reads the table, is drained before the copy. Returns whether the set of
  // steered layers changed.
  bool set(const float* table, const std::uint8_t* layers, cudaStream_t s);

  bool any() const noexcept { return count_ > 0; }
  bool steers(int layer) const noexcept { return layers_[layer] != 0; }
  std::vector<int> layers() const;
  // Layer `layer`'s vector in device memory [n_embd]; null where it has none.
  const float* vector(int layer) const noexcept;
  // The device table [n_layer][n_embd] (zeros on the layers without a vector); null where no layer has one.
  const float* table() const noexcept { return any() ? table_.as<float>() : nullptr; }
  // Changes whenever the set of steered layers does, and is never the same for two sets, of any sequences: a
  // captured step of several rows names its spans' generations in its key. 0: never steered.
  long generation() const noexcept { return generation_; }

 private:
  int device_, n_layer_, n_embd_;
  DeviceBuffer table_;
  std::vector<std::uint8_t> layers_;
  int count_ = 0;
  long generation_ = 0;
};

}  // namespace strata
