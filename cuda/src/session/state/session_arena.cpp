#include "strata/session_arena.hpp"

#include <cuda_runtime_api.h>

#include <numeric>

#include "../../runtime/device_buffer.hpp"
#include "../../runtime/pinned_memory.hpp"
#include "strata/device.hpp"
#include "strata/error.hpp"

namespace strata {
namespace {

constexpr const char* kPageTable = "kv page table";

std::unique_ptr<PinnedMapped> lock_host(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  try {
    return std::make_unique<PinnedMapped>(bytes);
  } catch (const CudaError& e) {
    throw OutOfMemory("KV streaming: locking " + std::to_string(bytes >> 20) + " MiB of host memory for the " +
                      "session's streamed KV failed (" + e.what() + "); a shorter context or a smaller KV format " +
                      "(k8v4, q4) needs less");
  }
}

}  // namespace

SessionArena::SessionArena(int device, SessionLayout layout) : device_(device), layout_(std::move(layout)) {
  require_device(device);
  DeviceScope scope(device);
  require_free_memory(layout_.total, device, "the session's state would",
                      "a shorter context or a smaller KV format (int8, k8v4, q4) needs less");
  STRATA_CUDA_TRY(cudaMalloc(&base_, layout_.total));
  try {
    host_ = lock_host(layout_.host_total);
    reset();
  } catch (...) {
    (void)cudaFree(base_);
    throw;
  }
}

SessionArena::~SessionArena() {
  if (base_) (void)cudaFree(base_);
}

void* SessionArena::region(const std::string& name, int layer) const {
  for (const Region& r : layout_.regions)
    if (r.name == name && r.layer == layer)
      return r.place == Place::Host ? host_->device<char>(r.offset) : static_cast<char*>(base_) + r.offset;
  throw InvalidArgument("the session arena has no region '" + name + "' for layer " + std::to_string(layer));
}

void SessionArena::reset() {
  DeviceScope scope(device_);
  std::vector<int> identity(static_cast<std::size_t>(layout_.kv_pages));
  std::iota(identity.begin(), identity.end(), 0);
  for (const Region& r : layout_.regions) {
    if (r.place == Place::Host) continue;
    char* at = static_cast<char*>(base_) + r.offset;
    if (r.name == kPageTable) {
      STRATA_CUDA_TRY(cudaMemcpy(at, identity.data(), r.bytes, cudaMemcpyHostToDevice));
    } else {
      STRATA_CUDA_TRY(cudaMemset(at, 0, r.bytes));
    }
  }
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
}

void SessionArena::snapshot(int slot) { copy_state(slot, true); }

void SessionArena::restore(int slot) { copy_state(slot, false); }

char* SessionArena::slot_start(int slot) const {
  STRATA_EXPECTS(slot >= 0 && slot < layout_.snapshots, InvalidArgument,
                 "state snapshot slot " + std::to_string(slot) + " is outside the session's " +
                     std::to_string(layout_.snapshots) + " slots");
  return static_cast<char*>(region("state snapshots")) + static_cast<std::size_t>(slot) * layout_.state_bytes;
}

void* SessionArena::slot_region(int slot, const std::string& name, int layer) const {
  return slot_start(slot) + layout_.slot_offset(name, layer);
}

void SessionArena::copy_state(int slot, bool save) {
  DeviceScope scope(device_);
  char* at = slot_start(slot);
  for (const Region& r : layout_.regions) {
    if (!is_recurrent_state(r.name)) continue;
    char* live = static_cast<char*>(base_) + r.offset;
    STRATA_CUDA_TRY(cudaMemcpy(save ? at : live, save ? live : at, r.bytes, cudaMemcpyDeviceToDevice));
    at += region_span(r.bytes);  // a slot mirrors the regions' spans (session_layout.hpp)
  }
  STRATA_CUDA_TRY(cudaDeviceSynchronize());
}

}  // namespace strata
