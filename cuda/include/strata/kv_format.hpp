// The KV cache formats of strata.KV as the native core sees them (docs/architecture.md, "KV formats"): the
// session's choice, how each half of a layer's cache (its keys, its values) holds an element, and the bytes
// that takes. The session layout sizes the cache with it, the kernels (kernels/kv.cuh) read and write it.
// No CUDA headers: the binding compiles it with the host compiler.
#pragma once

#include <cstddef>

namespace strata {

enum class KvStorage : int { Bf16 = 0, Int8 = 1, Q4 = 2, K8V4 = 3 };

// One half of the cache: bf16 elements; int8 codes; or 4-bit codes of the row after the orthonormal
// Walsh-Hadamard rotation (kernels/kv_rotation.cuh). Int8 and Q4 keep one fp16 scale per kKvGroup elements
// of a head row, after all the half's codes.
enum class KvCodes : int { Bf16 = 0, Int8 = 1, Q4 = 2 };

constexpr int kKvGroup = 32;

constexpr bool is_kv_storage(int kv) { return kv >= 0 && kv <= static_cast<int>(KvStorage::K8V4); }

constexpr KvCodes kv_key_codes(KvStorage kv) {
  return kv == KvStorage::Bf16 ? KvCodes::Bf16 : kv == KvStorage::Q4 ? KvCodes::Q4 : KvCodes::Int8;
}

// K8V4 keeps the keys as int8 (scores are the most sensitive to key error) and the values as rotated 4-bit.
constexpr KvCodes kv_value_codes(KvStorage kv) {
  return kv == KvStorage::Bf16 ? KvCodes::Bf16 : kv == KvStorage::Int8 ? KvCodes::Int8 : KvCodes::Q4;
}

// Bytes of the codes of `elements` elements (a multiple of kKvGroup); the scales follow at this offset.
constexpr std::size_t kv_code_bytes(KvCodes codes, std::size_t elements) {
  return codes == KvCodes::Bf16 ? 2 * elements : codes == KvCodes::Int8 ? elements : elements / 2;
}

constexpr std::size_t kv_scale_bytes(KvCodes codes, std::size_t elements) {
  return codes == KvCodes::Bf16 ? 0 : elements / kKvGroup * 2;
}

constexpr std::size_t kv_half_bytes(KvCodes codes, std::size_t elements) {
  return kv_code_bytes(codes, elements) + kv_scale_bytes(codes, elements);
}

}  // namespace strata
