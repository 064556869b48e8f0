// kernel_check entry of the decode step's fused router (kernels/router_publish.cuh): the router GEMV, top-k,
// cache slots and doorbell publish of one launch, captured into a CUDA graph and replayed, with the doorbell in
// real mapped host memory read back after each replay.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "../kernels/router.cuh"
#include "../kernels/router_publish.cuh"
#include "../runtime/pinned_memory.hpp"
#include "../runtime/stream.hpp"
#include "../session/programs/graph.hpp"
#include "../session/products/projection.hpp"
#include "kernel_check_support.hpp"
#include "strata/check/kernel_check.hpp"
#include "strata/device_weights.hpp"

namespace strata::kernel_check {
using namespace support;
namespace {

void check_router(const HostTensor& router, int replays, int k) {
  const long n_expert = router.rows, n = router.cols;
  STRATA_EXPECTS(n_expert > 0 && n_expert <= kernels::kRouterMaxExperts && n > 0, InvalidArgument,
                 "route_publish: the router " + router.name + " is " + std::to_string(n_expert) + " x " +
                     std::to_string(n) + ", expected 1 to " + std::to_string(kernels::kRouterMaxExperts) +
                     " experts of n > 0 columns");
  STRATA_EXPECTS(k > 0 && k <= kernels::kRouterMaxTopK && k <= n_expert, InvalidArgument,
                 "route_publish needs 0 < k <= min(n_expert=" + std::to_string(n_expert) + ", " +
                     std::to_string(kernels::kRouterMaxTopK) + "), got k=" + std::to_string(k));
  STRATA_EXPECTS(router.is_float || (n % router.form.super_size == 0 && kernels::gemv_quant_supports(router.form)),
                 InvalidArgument,
                 "route_publish: the router " + router.name + " has a quantized form the GEMV lacks, or " +
                     std::to_string(n) + " columns that are no multiple of its super-block");
  STRATA_EXPECTS(replays > 0, InvalidArgument, "route_publish needs replays > 0, got " + std::to_string(replays));
}

// Every byte 0xFF: NaN floats and -1 ids, so the test sees whatever a replay did not write.
void poison(void* host, std::size_t bytes) { std::memset(host, kPoison, bytes); }

}  // namespace

void route_publish(int device, const HostTensor& router, const float* x, int replays, int k,
                   const std::int32_t* slot_of, bool ring, int ring_base, const RoutePublishOutputs& out) {
  check_router(router, replays, k);
  check_device(device);
  DeviceScope scope(device);
  const int n_expert = static_cast<int>(router.rows), n = static_cast<int>(router.cols);
  const DeviceWeights weights(device, {router});
  const std::size_t x_bytes = static_cast<std::size_t>(n) * sizeof(float), k_bytes = k * sizeof(std::int32_t);
  DeviceBuffer d_x(x_bytes), d_base(sizeof(int)), d_ticket(sizeof(unsigned));
  DeviceBuffer d_slot_of = slot_of ? upload(slot_of, n_expert * sizeof(std::int32_t)) : DeviceBuffer(0);
  DeviceBuffer d_xq(static_cast<std::size_t>(n)), d_dx(x_bytes / 32 + 4), d_sums(x_bytes / 32 + 4);
  STRATA_CUDA_TRY(cudaMemset(d_ticket.as<void>(), 0, sizeof(unsigned)));  // as the decode scratch starts
  GuardedOutput d_logits(n_expert * sizeof(float)), d_ids(k_bytes), d_weights(k_bytes), d_slots(k_bytes);
  PinnedMapped bell_x(x_bytes), bell_ids(k_bytes), bell_weights(k_bytes), bell_seq(sizeof(int));
  kernels::RouteTargets targets{d_logits.data<float>(), d_ids.data<std::int32_t>(), d_weights.data<float>(),
                                slot_of ? d_slot_of.as<int>() : nullptr, d_slots.data<int>(),
                                d_ticket.as<unsigned>()};
  kernels::RoutePublish publish;
  publish.ring = ring;
  publish.bell.x = bell_x.device<float>();
  publish.bell.ids = bell_ids.device<int>();
  publish.bell.weights = bell_weights.device<float>();
  publish.bell.seq = bell_seq.device<int>();
  publish.bell.n = n;
  publish.bell.k = k;
  publish.ring_base = d_base.as<int>();
  publish.ring_offset = 1;
  const Q8Scratch q8{d_xq.as<std::int8_t>(), d_dx.as<float>(), d_sums.as<std::int32_t>()};
  const DeviceTensor& w = weights.get(router.name);
  Stream stream;
  // The decode step's own calls (projection.hpp): q8_32 of x where the router reads it, then the router.
  const CapturedGraph graph(stream.get(), [&](cudaStream_t s) {
    quantize_for(d_x.as<float>(), {{&w, d_logits.data<float>()}}, q8, s);
    route_and_publish(w, d_x.as<float>(), q8, k, targets, publish, s);
  });
  STRATA_CUDA_TRY(cudaDeviceSynchronize());  // uploads and poisoning (legacy stream) done before the first replay
  const std::size_t k_out = static_cast<std::size_t>(k);
  const cudaStream_t s = stream.get();
  for (int r = 0; r < replays; ++r) {
    const int base = ring_base + r;
    // Ordered on the replay's stream (a non-blocking one); pageable sources are staged before each call returns.
    const float* x_r = x + static_cast<std::size_t>(r) * n;
    STRATA_CUDA_TRY(cudaMemcpyAsync(d_x.as<void>(), x_r, x_bytes, cudaMemcpyHostToDevice, s));
    STRATA_CUDA_TRY(cudaMemcpyAsync(d_base.as<void>(), &base, sizeof(int), cudaMemcpyHostToDevice, s));
    for (const GuardedOutput* o : {&d_ids, &d_weights, &d_slots})
      STRATA_CUDA_TRY(cudaMemsetAsync(o->data<void>(), kPoison, k_bytes, s));
    STRATA_CUDA_TRY(cudaMemsetAsync(d_logits.data<void>(), kPoison, n_expert * sizeof(float), s));
    poison(bell_x.host<void>(), x_bytes);
    poison(bell_ids.host<void>(), k_bytes);
    poison(bell_weights.host<void>(), k_bytes);
    poison(bell_seq.host<void>(), sizeof(int));
    graph.launch(s);
    STRATA_CUDA_TRY(cudaStreamSynchronize(s));
    d_logits.copy_out(out.logits + static_cast<std::size_t>(r) * n_expert, "route_publish (logits)");
    d_ids.copy_out(out.ids + r * k_out, "route_publish (ids)");
    d_weights.copy_out(out.weights + r * k_out, "route_publish (weights)");
    d_slots.copy_out(out.slots + r * k_out, "route_publish (slots)");
    std::memcpy(out.bell_x + static_cast<std::size_t>(r) * n, bell_x.host<void>(), x_bytes);
    std::memcpy(out.bell_ids + r * k_out, bell_ids.host<void>(), k_bytes);
    std::memcpy(out.bell_weights + r * k_out, bell_weights.host<void>(), k_bytes);
    std::memcpy(out.seq + r, bell_seq.host<void>(), sizeof(int));
  }
  STRATA_CUDA_TRY(cudaMemcpy(out.ticket, d_ticket.as<void>(), sizeof(unsigned), cudaMemcpyDeviceToHost));
}

}  // namespace strata::kernel_check
