#include "core/factory.h"

#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/native/copy.h"
#include "core/native/random.h"

namespace ember {
namespace {
// make_tensor after the shape checks under the factory's own name, so that an invalid or
// overflowing shape is reported as, say, "zeros: shape [...] has more than 2^63 - 1 elements".
Tensor allocate(const char* op, const Shape& shape, DType dtype, Device device) {
  nbytes_of(shape, dtype_size(dtype), op);
  contiguous_strides(shape, op);
  return make_tensor(shape, dtype, device);
}

Tensor filled(const char* op, const Shape& shape, double value, const TensorOptions& opt) {
  Tensor t = allocate(op, shape, opt.dtype, opt.device);
  native::fill_(t, value);
  return t;
}

Tensor finish(Tensor t, const TensorOptions& opt) {
  if (opt.requires_grad) t.requires_grad_(true);
  return t;
}
}  // namespace

Tensor empty(const Shape& shape, TensorOptions opt) {
  return finish(allocate("empty", shape, opt.dtype, opt.device), opt);
}

Tensor full(const Shape& shape, double value, TensorOptions opt) {
  return finish(filled("full", shape, value, opt), opt);
}

Tensor zeros(const Shape& shape, TensorOptions opt) { return finish(filled("zeros", shape, 0.0, opt), opt); }
Tensor ones(const Shape& shape, TensorOptions opt) { return finish(filled("ones", shape, 1.0, opt), opt); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), {t.dtype(), t.device()}); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), {t.dtype(), t.device()}); }
Tensor empty_like(const Tensor& t) { return empty(t.shape(), {t.dtype(), t.device()}); }
Tensor full_like(const Tensor& t, double value) { return full(t.shape(), value, {t.dtype(), t.device()}); }
Tensor scalar_tensor(double value, TensorOptions opt) { return full({}, value, opt); }

Tensor arange(double start, double end, double step, TensorOptions opt) {
  EMBER_CHECK(step != 0, "arange: step must be non-zero");
  EMBER_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
              "arange: start, end and step must be finite");
  const double span = std::ceil((end - start) / step);
  // 2^63 as a double: a larger count does not convert to int64_t.
  EMBER_CHECK(span < 9223372036854775808.0, "arange: [", start, ", ", end, ") in steps of ", step,
              " has more than 2^63 - 1 elements");
  const int64_t n = span > 0 ? int64_t(span) : 0;
  Tensor t64 = allocate("arange", {n}, DType::f64, Device::cpu());
  double* p = t64.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) p[i] = start + double(i) * step;
  Tensor t = native::to_dtype(t64, opt.dtype);
  return finish(native::to_device(t, opt.device), opt);
}

Tensor arange(int64_t end, TensorOptions opt) { return arange(0.0, double(end), 1.0, opt); }

template <typename T>
Tensor from_vector(const std::vector<T>& values, Shape shape, TensorOptions opt) {
  if (shape.empty()) shape = {int64_t(values.size())};  // like torch.tensor([...]); 0-d: scalar_tensor
  EMBER_CHECK(numel_of(shape, "from_vector") == int64_t(values.size()), "from_vector: ", values.size(),
              " values do not fill shape ", shape);
  Tensor raw = allocate("from_vector", shape, dtype_of<T>::value, Device::cpu());
  if constexpr (std::is_same_v<T, bool>) {
    bool* p = raw.data_ptr<bool>();
    for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  } else {
    if (!values.empty()) std::memcpy(raw.raw_data(), values.data(), values.size() * sizeof(T));
  }
  Tensor t = native::to_device(native::to_dtype(raw, opt.dtype), opt.device);
  return finish(t, opt);
}

template Tensor from_vector<float>(const std::vector<float>&, Shape, TensorOptions);
template Tensor from_vector<double>(const std::vector<double>&, Shape, TensorOptions);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, Shape, TensorOptions);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, Shape, TensorOptions);
template Tensor from_vector<bool>(const std::vector<bool>&, Shape, TensorOptions);
template Tensor from_vector<Half>(const std::vector<Half>&, Shape, TensorOptions);
template Tensor from_vector<BFloat16>(const std::vector<BFloat16>&, Shape, TensorOptions);

Tensor from_buffer(const void* data, const Shape& shape, DType dtype, Device device) {
  Tensor raw = allocate("from_buffer", shape, dtype, Device::cpu());
  const size_t nbytes = size_t(raw.numel()) * dtype_size(dtype);
  EMBER_CHECK(data != nullptr || nbytes == 0, "from_buffer: null data for shape ", shape);
  if (nbytes) std::memcpy(raw.raw_data(), data, nbytes);
  return native::to_device(raw, device);
}

Tensor from_blob(void* data, const Shape& shape, DType dtype, std::function<void(void*)> deleter) {
  auto impl = std::make_shared<TensorImpl>();
  const size_t nbytes = nbytes_of(shape, dtype_size(dtype), "from_blob");
  Shape strides = contiguous_strides(shape, "from_blob");
  impl->storage = std::make_shared<Storage>(data, nbytes, Device::cpu(), std::move(deleter));
  impl->shape = shape;
  impl->strides = std::move(strides);
  impl->dtype = dtype;
  return Tensor(impl);
}

Tensor rand(const Shape& shape, TensorOptions opt) {
  Tensor t = allocate("rand", shape, opt.dtype, opt.device);
  EMBER_CHECK(is_floating(opt.dtype), "rand: expected a floating dtype, got ", dtype_name(opt.dtype));
  native::random_fill(t, native::RandomKind::Uniform, 0.0, 1.0);
  return finish(t, opt);
}

Tensor randn(const Shape& shape, TensorOptions opt) {
  Tensor t = allocate("randn", shape, opt.dtype, opt.device);
  EMBER_CHECK(is_floating(opt.dtype), "randn: expected a floating dtype, got ", dtype_name(opt.dtype));
  native::random_fill(t, native::RandomKind::Normal, 0.0, 1.0);
  return finish(t, opt);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opt) {
  Tensor t = allocate("randint", shape, opt.dtype, opt.device);
  native::random_fill(t, native::RandomKind::Integer, double(low), double(high));
  return finish(t, opt);
}

}  // namespace ember
