#include "kernels/reference/ref_tensor.h"

#include <algorithm>

namespace ember::reference {

int64_t RefTensor::flat(const Shape& idx) const {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + idx[d];
  return f;
}

double RefTensor::broadcast_at(const Shape& idx, const Shape& out_shape) const {
  const size_t off = out_shape.size() - shape.size();
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + (shape[d] == 1 ? 0 : idx[off + d]);
  return data[size_t(f)];
}

Shape unravel(int64_t i, const Shape& shape) {
  Shape idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = i % shape[d];
    i /= shape[d];
  }
  return idx;
}

RefTensor from_tensor(const Tensor& t) {
  RefTensor r(t.shape());
  const std::vector<double> v = t.to_vector<double>();
  r.data.assign(v.begin(), v.end());
  return r;
}

Tensor to_tensor(const RefTensor& r, DType dtype) {
  Tensor t = make_tensor(r.shape, DType::f64, Device::cpu());
  std::copy(r.data.begin(), r.data.end(), t.data_ptr<double>());
  return dtype == DType::f64 ? t : t.to(dtype);
}

}  // namespace ember::reference
