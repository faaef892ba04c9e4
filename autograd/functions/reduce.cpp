// Differentiable reductions. Every backward first gives the incoming gradient the input's
// rank back (reduced dims as size 1) so it broadcasts against the input. The formulas are
// differentiable ops on inputs saved with their history, so they can be differentiated again
// (create_graph); amax and amin read their saved tensors only to find where the extreme is.
#include "autograd/node.h"
#include "core/autocast.h"
#include "core/native/copy.h"
#include "core/native/reduce.h"
#include "core/native/views.h"
#include "core/ops.h"

namespace ember {
using autograd::Tensors;

namespace {

// `g` (the gradient of a reduction over `dims` of a tensor of `in_shape`) with the reduced
// dims present as size 1, whether or not the forward kept them.
Tensor with_reduced_dims(const Tensor& g, const Shape& in_shape, const Shape& dims) {
  return g.reshape(native::reduced_shape(in_shape, dims, true));
}

Tensor broadcast_back(const Tensor& g, const Shape& in_shape, const Shape& dims) {
  return with_reduced_dims(g, in_shape, dims).expand(in_shape);
}

int64_t reduced_count(const Shape& in_shape, const Shape& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= in_shape[size_t(d)];
  return n;
}

// Gradient of amax/amin: shared evenly among the elements equal to the extreme.
Tensors extreme_backward(const Tensor& g, const Tensor& x, const Tensor& y, const Shape& dims) {
  const Shape in = x.shape();
  Tensor y_k = with_reduced_dims(y, in, dims);
  Tensor mask = native::to_dtype(eq(x, y_k), x.dtype());
  Tensor count = sum(mask, dims, true);
  return {mul(mask, div(with_reduced_dims(g, in, dims), count))};
}

}  // namespace

Tensor sum(const Tensor& x_in, const Shape& dims, bool keepdim) {
  const Tensor x = autocast::to_f32(x_in);
  Tensor y = native::sum(x, dims, keepdim);
  if (autograd::needs_grad({x})) {
    const Shape in = x.shape();
    const Shape d = native::reduction_dims(dims, in, "sum");
    autograd::record(
        "SumBackward", {x}, {y}, [in, d](const Tensors& g) -> Tensors { return {broadcast_back(g[0], in, d)}; },
        autograd::Backward::differentiable);
  }
  return y;
}

Tensor mean(const Tensor& x_in, const Shape& dims, bool keepdim) {
  const Tensor x = autocast::to_f32(x_in);
  Tensor y = native::mean(x, dims, keepdim);
  if (autograd::needs_grad({x})) {
    const Shape in = x.shape();
    const Shape d = native::reduction_dims(dims, in, "mean");
    const double scale = 1.0 / double(reduced_count(in, d));
    autograd::record(
        "MeanBackward", {x}, {y},
        [in, d, scale](const Tensors& g) -> Tensors { return {broadcast_back(mul(g[0], scale), in, d)}; },
        autograd::Backward::differentiable);
  }
  return y;
}

Tensor amax(const Tensor& x, const Shape& dims, bool keepdim) {
  Tensor y = native::amax(x, dims, keepdim);
  if (autograd::needs_grad({x})) {
    const Shape d = native::reduction_dims(dims, x.shape(), "amax");
    autograd::SavedTensor xs = autograd::save(x), ys = autograd::save(y);
    autograd::record(
        "AmaxBackward", {x}, {y},
        [xs, ys, d](const Tensors& g) -> Tensors { return extreme_backward(g[0], xs.unpack(), ys.unpack(), d); },
        autograd::Backward::differentiable);
  }
  return y;
}

Tensor amin(const Tensor& x, const Shape& dims, bool keepdim) {
  Tensor y = native::amin(x, dims, keepdim);
  if (autograd::needs_grad({x})) {
    const Shape d = native::reduction_dims(dims, x.shape(), "amin");
    autograd::SavedTensor xs = autograd::save(x), ys = autograd::save(y);
    autograd::record(
        "AminBackward", {x}, {y},
        [xs, ys, d](const Tensors& g) -> Tensors { return extreme_backward(g[0], xs.unpack(), ys.unpack(), d); },
        autograd::Backward::differentiable);
  }
  return y;
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) { return native::argmax(x, dim, keepdim); }
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) { return native::argmin(x, dim, keepdim); }

Tensor var(const Tensor& x_in, const Shape& dims, int64_t correction, bool keepdim) {
  const Tensor x = autocast::to_f32(x_in);
  Tensor y = native::var(x, dims, correction, keepdim);
  if (autograd::needs_grad({x})) {
    const Shape d = native::reduction_dims(dims, x.shape(), "var");
    const double dof = double(reduced_count(x.shape(), d) - correction);
    autograd::SavedTensor xs = autograd::save_with_history(x);
    autograd::record(
        "VarBackward", {x}, {y},
        [xs, d, dof](const Tensors& g) -> Tensors {
          // d var / dx = 2 (x - mean) / (N - correction)
          const Tensor x_saved = xs.unpack();
          Tensor centered = sub(x_saved, mean(x_saved, d, true));
          return {mul(centered, mul(with_reduced_dims(g[0], x_saved.shape(), d), 2.0 / dof))};
        },
        autograd::Backward::differentiable);
  }
  return y;
}

Tensor Tensor::sum() const { return ember::sum(*this); }
Tensor Tensor::sum(const Shape& dims, bool keepdim) const { return ember::sum(*this, dims, keepdim); }
Tensor Tensor::mean() const { return ember::mean(*this); }
Tensor Tensor::mean(const Shape& dims, bool keepdim) const { return ember::mean(*this, dims, keepdim); }
Tensor Tensor::max() const { return ember::amax(*this); }
Tensor Tensor::min() const { return ember::amin(*this); }
Tensor Tensor::argmax(int64_t dim, bool keepdim) const { return ember::argmax(*this, dim, keepdim); }
Tensor Tensor::var(const Shape& dims, int64_t correction, bool keepdim) const {
  return ember::var(*this, dims, correction, keepdim);
}

}  // namespace ember
