// The oracle's data type: a dense row-major array of doubles with a shape. Reference ops
// are written as plain loops over RefTensors, for obviousness rather than speed.
#pragma once
#include <vector>

#include "core/tensor.h"

namespace ember::reference {

struct RefTensor {
  Shape shape;
  std::vector<double> data;

  RefTensor() = default;
  explicit RefTensor(Shape s, double fill = 0.0) : shape(std::move(s)), data(size_t(numel_of(shape)), fill) {}
  int64_t numel() const { return int64_t(data.size()); }
  int64_t dim() const { return int64_t(shape.size()); }
  // Row-major flat index of a multi-index.
  int64_t flat(const Shape& idx) const;
  double& at(const Shape& idx) { return data[size_t(flat(idx))]; }
  double at(const Shape& idx) const { return data[size_t(flat(idx))]; }
  // Value at `idx` of the output shape `out_shape`, reading this tensor broadcast to it.
  double broadcast_at(const Shape& idx, const Shape& out_shape) const;
};

// Any dtype/device/strides -> RefTensor (values converted to double, logical order).
RefTensor from_tensor(const Tensor& t);
// RefTensor -> contiguous CPU tensor of `dtype` (f64 by default).
Tensor to_tensor(const RefTensor& r, DType dtype = DType::f64);
// Multi-index of flat position `i` in `shape` (row-major).
Shape unravel(int64_t i, const Shape& shape);

}  // namespace ember::reference
