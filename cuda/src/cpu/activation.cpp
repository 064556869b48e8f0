#include "activation.hpp"

#include <algorithm>
#include <cmath>

namespace strata::cpu {

void quantize_blocks(const float* x, int64_t block0, int64_t block1, const QuantizedVector& q) {
  constexpr int kBlock = 32;
  for (int64_t b = block0; b < block1; ++b) {
    const float* xb = x + b * kBlock;
    int8_t* qb = q.xq + b * kBlock;
    float amax = 0.0f;
    for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float dx = amax / 127.0f;
    int sums[2] = {0, 0};
    for (int i = 0; i < kBlock; ++i) {
      // roundf rounds half away from zero, as the contract says; the clip only bites for subnormal dx.
      const float r = dx == 0.0f ? 0.0f : std::round(xb[i] / dx);
      const int v = static_cast<int>(std::min(127.0f, std::max(-127.0f, r)));
      qb[i] = static_cast<int8_t>(v);
      sums[i / 16] += v;
    }
    q.dx[b] = dx;
    q.dx16[2 * b] = q.dx16[2 * b + 1] = dx;
    q.xs16[2 * b] = dx * static_cast<float>(sums[0]);
    q.xs16[2 * b + 1] = dx * static_cast<float>(sums[1]);
    q.xs32[b] = dx * static_cast<float>(sums[0] + sums[1]);
  }
}

}  // namespace strata::cpu
