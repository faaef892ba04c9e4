// Differentiable softmax, log-softmax and layer norm. Their backward passes run dedicated
// kernels (core/native/normalization.h) rather than chains of generic ops.
#include "autograd/node.h"
#include "core/autocast.h"
#include "core/native/normalization.h"
#include "core/ops.h"

namespace ember {
using autograd::Tensors;

Tensor softmax(const Tensor& x_in, int64_t dim) {
  const Tensor x = autocast::to_f32(x_in);
  Tensor y = native::softmax(x, dim);
  if (autograd::needs_grad({x})) {
    autograd::SavedTensor ys = autograd::save(y);
    autograd::record("SoftmaxBackward", {x}, {y}, [ys, dim](const Tensors& g) -> Tensors {
      return {native::softmax_backward(g[0], ys.unpack(), dim)};
    });
  }
  return y;
}

Tensor log_softmax(const Tensor& x_in, int64_t dim) {
  const Tensor x = autocast::to_f32(x_in);
  Tensor y = native::log_softmax(x, dim);
  if (autograd::needs_grad({x})) {
    autograd::SavedTensor ys = autograd::save(y);
    autograd::record("LogSoftmaxBackward", {x}, {y}, [ys, dim](const Tensors& g) -> Tensors {
      return {native::log_softmax_backward(g[0], ys.unpack(), dim)};
    });
  }
  return y;
}

Tensor layer_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight_in, const Tensor& bias_in,
                  double eps) {
  const Tensor x = autocast::to_f32(x_in), weight = autocast::to_f32(weight_in), bias = autocast::to_f32(bias_in);
  native::LayerNormResult r = native::layer_norm(x, normalized_shape, weight, bias, eps);
  if (autograd::needs_grad({x, weight, bias})) {
    const bool need_dx = x.requires_grad();
    const bool need_dw = weight.defined() && weight.requires_grad();
    const bool need_db = bias.defined() && bias.requires_grad();
    autograd::SavedTensor xs = autograd::save(x), ws = autograd::save(weight), bs = autograd::save(bias);
    Tensor mean = r.mean, rstd = r.rstd;
    autograd::record("LayerNormBackward", {x, weight, bias}, {r.y},
                     [=](const Tensors& g) -> Tensors {
                       native::LayerNormGrads d = native::layer_norm_backward(
                           g[0], xs.unpack(), normalized_shape, mean, rstd, ws.unpack(), bs.unpack(), need_dx, need_dw,
                           need_db);
                       return {d.dx, d.dweight, d.dbias};
                     });
  }
  return r.y;
}

Tensor Tensor::softmax(int64_t dim) const { return ember::softmax(*this, dim); }
Tensor Tensor::log_softmax(int64_t dim) const { return ember::log_softmax(*this, dim); }

}  // namespace ember
