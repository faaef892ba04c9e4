// Bitwise snapshots of tensors and state dicts, for tests that a refused load changed nothing:
// two snapshots compare equal only when every dtype, shape and byte is the same.
#pragma once
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ember::testing {

struct TensorBytes {
  DType dtype = DType::f32;
  Shape shape;
  std::vector<uint8_t> bytes;
  bool operator==(const TensorBytes&) const = default;
};

inline TensorBytes tensor_bytes(const Tensor& t) {
  const Tensor c = t.to(Device::cpu()).contiguous();
  const auto* p = static_cast<const uint8_t*>(c.raw_data());
  return {c.dtype(), c.shape(), std::vector<uint8_t>(p, p + size_t(c.numel()) * c.element_size())};
}

inline std::map<std::string, TensorBytes> tensors_bytes(const std::map<std::string, Tensor>& tensors) {
  std::map<std::string, TensorBytes> out;
  for (const auto& [k, t] : tensors) out[k] = tensor_bytes(t);
  return out;
}

// A double's bits (NaN compares equal to the same NaN).
inline uint64_t double_bits(double v) {
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

inline std::map<std::string, uint64_t> scalars_bits(const std::map<std::string, double>& scalars) {
  std::map<std::string, uint64_t> out;
  for (const auto& [k, v] : scalars) out[k] = double_bits(v);
  return out;
}

}  // namespace ember::testing
