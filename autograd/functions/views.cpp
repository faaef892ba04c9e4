// Differentiable views and copies: each forward is a geometry change (core/native/views.h),
// each backward maps the gradient back to the input's geometry with differentiable ops, so it
// can be differentiated again (create_graph).
#include <numeric>
#include <string>

#include "autograd/node.h"
#include "core/factory.h"
#include "core/native/copy.h"
#include "core/native/views.h"
#include "core/ops.h"

namespace ember {
using autograd::Tensors;

namespace {
// Wraps a view op: records `backward` when the input needs grad.
template <typename Bwd>
Tensor view_op(const char* name, const Tensor& x, Tensor y, Bwd backward) {
  if (autograd::needs_grad({x})) autograd::record(name, {x}, {y}, backward, autograd::Backward::differentiable);
  return y;
}

// Gradient of a strided view of `in_shape`: scatter into zeros through the same view. That is
// linear in g, and its own gradient is the same view of the incoming one (same_view being the
// differentiable view op), recorded as `<node>Backward`.
Tensor view_grad_scatter(const char* node, const Tensor& g, const Shape& in_shape,
                         const std::function<Tensor(const Tensor&)>& same_view) {
  Tensor full_grad = zeros(in_shape, {g.dtype(), g.device()});
  native::copy_(same_view(full_grad), g);
  if (autograd::needs_grad({g})) {
    autograd::record(
        std::string(node) + "Backward", {g}, {full_grad},
        [same_view](const Tensors& h) -> Tensors { return {same_view(h[0])}; }, autograd::Backward::differentiable);
  }
  return full_grad;
}

// The inverse of a permutation of dims.
Shape inverse_permutation(const Shape& dims, int64_t rank) {
  Shape inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) inverse[normalize_dim(dims[i], rank, "permute")] = int64_t(i);
  return inverse;
}
}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  const Shape in = this->shape();
  return view_op("ViewBackward", *this, native::view(*this, shape),
                 [in](const Tensors& g) -> Tensors { return {g[0].reshape(in)}; });
}

Tensor Tensor::reshape(const Shape& shape) const {
  const Shape in = this->shape();
  return view_op("ReshapeBackward", *this, native::reshape(*this, shape),
                 [in](const Tensors& g) -> Tensors { return {g[0].reshape(in)}; });
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  start_dim = normalize_dim(start_dim, dim(), "flatten");
  end_dim = normalize_dim(end_dim, dim(), "flatten");
  EMBER_CHECK(start_dim <= end_dim, "flatten: start_dim ", start_dim, " is after end_dim ", end_dim);
  Shape sh(shape().begin(), shape().begin() + start_dim);
  int64_t m = 1;
  for (int64_t d = start_dim; d <= end_dim; ++d) m *= shape()[d];
  sh.push_back(m);
  sh.insert(sh.end(), shape().begin() + end_dim + 1, shape().end());
  return reshape(sh);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  return view_op("TransposeBackward", *this, native::transpose(*this, d0, d1),
                 [d0, d1](const Tensors& g) -> Tensors { return {g[0].transpose(d0, d1)}; });
}

Tensor Tensor::t() const {
  EMBER_CHECK(dim() <= 2, "t: expects a tensor with at most 2 dims, got shape ", shape());
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::permute(const Shape& dims) const {
  Tensor y = native::permute(*this, dims);
  return view_op("PermuteBackward", *this, y, [inverse = inverse_permutation(dims, dim())](const Tensors& g) -> Tensors {
    return {g[0].permute(inverse)};
  });
}

Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
  const Shape in = shape();
  return view_op("SliceBackward", *this, native::slice(*this, dim, start, end, step),
                 [in, dim, start, end, step](const Tensors& g) -> Tensors {
                   return {view_grad_scatter("SliceBackward", g[0], in, [dim, start, end, step](const Tensor& t) {
                     return t.slice(dim, start, end, step);
                   })};
                 });
}

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  EMBER_CHECK(this->dim() > 0, "narrow: cannot narrow a 0-d tensor");
  const int64_t d = normalize_dim(dim, this->dim(), "narrow");
  const int64_t n = shape()[d];
  if (start < 0) start += n;
  EMBER_CHECK(start >= 0 && length >= 0 && start + length <= n, "narrow: start ", start, " + length ",
              length, " exceeds dim ", d, " of size ", n, " (shape ", shape(), ")");
  return slice(d, start, start + length, 1);
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
  const Shape in = shape();
  return view_op("SelectBackward", *this, native::select(*this, dim, index),
                 [in, dim, index](const Tensors& g) -> Tensors {
                   return {view_grad_scatter("SelectBackward", g[0], in, [dim, index](const Tensor& t) {
                     return t.select(dim, index);
                   })};
                 });
}

Tensor Tensor::expand(const Shape& shape) const {
  const Shape in = this->shape();
  return view_op("ExpandBackward", *this, native::expand(*this, shape),
                 [in](const Tensors& g) -> Tensors {
                   // sum over the broadcast dims back to the input shape
                   const int64_t lead = g[0].dim() - int64_t(in.size());
                   Shape dims;
                   for (int64_t i = 0; i < g[0].dim(); ++i)
                     if (i < lead || (in[i - lead] == 1 && g[0].shape()[i] != 1)) dims.push_back(i);
                   Tensor s = dims.empty() ? g[0] : ember::sum(g[0], dims, true);
                   return {s.reshape(in)};
                 });
}

Tensor Tensor::squeeze() const {
  const Shape in = shape();
  return view_op("SqueezeBackward", *this, native::squeeze(*this, std::nullopt),
                 [in](const Tensors& g) -> Tensors { return {g[0].reshape(in)}; });
}

Tensor Tensor::squeeze(int64_t dim) const {
  const Shape in = shape();
  return view_op("SqueezeBackward", *this, native::squeeze(*this, dim),
                 [in](const Tensors& g) -> Tensors { return {g[0].reshape(in)}; });
}

Tensor Tensor::unsqueeze(int64_t dim) const {
  const Shape in = shape();
  return view_op("UnsqueezeBackward", *this, native::unsqueeze(*this, dim),
                 [in](const Tensors& g) -> Tensors { return {g[0].reshape(in)}; });
}

Tensor Tensor::clone() const {
  return view_op("CloneBackward", *this, native::clone(*this),
                 [](const Tensors& g) -> Tensors { return {g[0]}; });
}

Tensor Tensor::to(DType dtype) const {
  if (this->dtype() == dtype) return *this;
  const DType in = this->dtype();
  Tensor y = native::to_dtype(*this, dtype);
  if (!is_floating(dtype)) return y;  // integer results carry no gradient
  return view_op("ToDTypeBackward", *this, y,
                 [in](const Tensors& g) -> Tensors { return {g[0].to(in)}; });
}

Tensor Tensor::to(Device device, bool non_blocking) const {
  if (this->device() == device) return *this;
  const Device in = this->device();
  return view_op("ToDeviceBackward", *this, native::to_device(*this, device, non_blocking),
                 [in](const Tensors& g) -> Tensors { return {g[0].to(in)}; });
}

Tensor Tensor::pin_memory() const { return native::pin_memory(*this); }
bool Tensor::is_pinned() const { return native::is_pinned(*this); }

}  // namespace ember
