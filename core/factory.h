// Tensor factories. Random factories draw from the default generator (core/rng.h), so
// manual_seed(s) fixes every number they produce, whatever the thread count.
#pragma once
#include <vector>

#include "core/tensor.h"

namespace ember {

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  bool requires_grad = false;
};

Tensor empty(const Shape& shape, TensorOptions opt = {});
Tensor zeros(const Shape& shape, TensorOptions opt = {});
Tensor ones(const Shape& shape, TensorOptions opt = {});
Tensor full(const Shape& shape, double value, TensorOptions opt = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor empty_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
// [start, end) in steps; dtype defaults to i64 (pass f32 etc. in opt for floats).
Tensor arange(double start, double end, double step = 1.0, TensorOptions opt = {DType::i64});
Tensor arange(int64_t end, TensorOptions opt = {DType::i64});
Tensor scalar_tensor(double value, TensorOptions opt = {});

// Copies values; the shape defaults to 1-D. dtype follows T unless opt says otherwise.
template <typename T>
Tensor from_vector(const std::vector<T>& values, Shape shape = {}, TensorOptions opt = {dtype_of<T>::value});
// Copies n elements of `dtype` from host memory.
Tensor from_buffer(const void* data, const Shape& shape, DType dtype, Device device = Device::cpu());
// Wraps caller-owned memory without copying; `deleter` runs when the last view dies.
Tensor from_blob(void* data, const Shape& shape, DType dtype, std::function<void(void*)> deleter = {});

Tensor rand(const Shape& shape, TensorOptions opt = {});    // U[0, 1)
Tensor randn(const Shape& shape, TensorOptions opt = {});   // N(0, 1)
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opt = {DType::i64});

}  // namespace ember
