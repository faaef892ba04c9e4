// With xhat the normalised input and gh = d loss / d xhat (g times the weight), the gradient of x
// is rstd (gh - mean(gh) - xhat mean(gh xhat)), the means over the normalised elements (RMS norm
// subtracts no mean, so it drops the middle term); the weight's is the sum of g xhat and the
// bias's the sum of g over the other dims.
#include "autograd/functions/normalization_gradients.h"

#include <functional>

#include "core/ops.h"

namespace ember::autograd {
namespace {

Shape range_dims(int64_t begin, int64_t end) {
  Shape dims;
  for (int64_t d = begin; d < end; ++d) dims.push_back(d);
  return dims;
}

// Every dim of an ndim-tensor but the channel dim 1.
Shape all_but_channels(int64_t ndim) {
  Shape dims{0};
  for (int64_t d = 2; d < ndim; ++d) dims.push_back(d);
  return dims;
}

// sum over dims; t itself when there are none (sum's empty list means all dims).
Tensor sum_over(const Tensor& t, const Shape& dims) { return dims.empty() ? t : sum(t, dims); }

// t [C] as [1, C, 1, ...] against an ndim-tensor [N, C, *].
Tensor per_channel(const Tensor& t, int64_t ndim) {
  Shape shape(size_t(ndim), 1);
  shape[1] = t.numel();
  return t.reshape(shape);
}

struct Normalized {
  Tensor xhat, rstd;  // rstd keeps the reduced dims
};

// The mean over the normalised elements, keeping their dims.
using MeanOf = std::function<Tensor(const Tensor&)>;

MeanOf mean_over(const Shape& dims) {
  return [dims](const Tensor& t) { return mean(t, dims, true); };
}

Normalized standardize(const Tensor& x, const MeanOf& mean_of, double eps) {
  const Tensor centered = sub(x, mean_of(x));
  const Tensor rstd = rsqrt(add(mean_of(mul(centered, centered)), eps));
  return {mul(centered, rstd), rstd};
}

Normalized root_mean_square_scaled(const Tensor& x, const Shape& dims, double eps) {
  const Tensor rstd = rsqrt(add(mean(mul(x, x), dims, true), eps));
  return {mul(x, rstd), rstd};
}

// d loss / dx from gh = d loss / d xhat; centered: xhat subtracts the mean (not RMS norm).
Tensor input_gradient(const Tensor& gh, const Normalized& n, const MeanOf& mean_of, bool centered) {
  Tensor inner = sub(gh, mul(n.xhat, mean_of(mul(gh, n.xhat))));
  if (centered) inner = sub(inner, mean_of(gh));
  return mul(n.rstd, inner);
}

// {dx, dweight, dbias} of y = xhat w + b: dx = dx_of(gh), gh = g times w (weight_view: w broadcast
// against g, or undefined); w's and b's gradients are sums over param_dims.
template <class InputGradient>
Tensors affine_gradients(const Tensor& g, const Tensor& xhat, const Tensor& weight_view, const Shape& param_dims,
                         NormGradsWanted wanted, InputGradient dx_of) {
  Tensors grads(3);
  if (wanted.dx) grads[0] = dx_of(weight_view.defined() ? mul(g, weight_view) : g);
  if (wanted.dweight) grads[1] = sum_over(mul(g, xhat), param_dims);
  if (wanted.dbias) grads[2] = sum_over(g, param_dims);
  return grads;
}

Tensors trailing_norm_gradients(const Tensor& g, const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                                double eps, NormGradsWanted wanted, bool centered) {
  if (x.numel() == 0) return {};
  const int64_t ndim = x.dim(), batch_dims = ndim - int64_t(normalized_shape.size());
  const Shape norm_dims = range_dims(batch_dims, ndim);
  const Normalized n =
      centered ? standardize(x, mean_over(norm_dims), eps) : root_mean_square_scaled(x, norm_dims, eps);
  // weight has the trailing shape, so it broadcasts as it is
  return affine_gradients(g, n.xhat, weight, range_dims(0, batch_dims), wanted, [&](const Tensor& gh) {
    return input_gradient(gh, n, mean_over(norm_dims), centered);
  });
}

}  // namespace

Tensors layer_norm_gradients(const Tensor& g, const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                             double eps, NormGradsWanted wanted) {
  return trailing_norm_gradients(g, x, normalized_shape, weight, eps, wanted, /*centered=*/true);
}

Tensors rms_norm_gradients(const Tensor& g, const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                           double eps, NormGradsWanted wanted) {
  return trailing_norm_gradients(g, x, normalized_shape, weight, eps, {wanted.dx, wanted.dweight, false},
                                 /*centered=*/false);
}

Tensors group_norm_gradients(const Tensor& g, const Tensor& x, int64_t num_groups, const Tensor& weight, double eps,
                             NormGradsWanted wanted) {
  if (x.numel() == 0) return {};
  const int64_t ndim = x.dim();
  const Shape grouped{x.size(0), num_groups, x.numel() / (x.size(0) * num_groups)};
  // normalised per group; the weight is per channel, so gh is grouped after the product
  const Normalized n = standardize(x.reshape(grouped), mean_over({2}), eps);
  return affine_gradients(g, n.xhat.reshape(x.shape()), weight.defined() ? per_channel(weight, ndim) : Tensor(),
                          all_but_channels(ndim), wanted, [&](const Tensor& gh) {
                            return input_gradient(gh.reshape(grouped), n, mean_over({2}), true).reshape(x.shape());
                          });
}

Tensors batch_norm_gradients(const Tensor& g, const Tensor& x, const Tensor& weight, double eps,
                             NormGradsWanted wanted) {
  if (x.numel() == 0) return {};
  return batch_norm_gradients(g, x, weight, eps, wanted, {});
}

Tensors batch_norm_gradients(const Tensor& g, const Tensor& x, const Tensor& weight, double eps,
                             NormGradsWanted wanted, const WholeBatch& whole_batch) {
  const int64_t ndim = x.dim();
  const Shape dims = all_but_channels(ndim);
  const MeanOf mean_of = whole_batch.sum_over_batches
                             ? MeanOf([&](const Tensor& t) {
                                 return div(whole_batch.sum_over_batches(sum(t, dims, true)), whole_batch.count);
                               })
                             : mean_over(dims);
  const Normalized n = standardize(x, mean_of, eps);
  return affine_gradients(g, n.xhat, weight.defined() ? per_channel(weight, ndim) : Tensor(), dims, wanted,
                          [&](const Tensor& gh) { return input_gradient(gh, n, mean_of, true); });
}

Tensors batch_norm_eval_gradients(const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                                  const Tensor& weight, NormGradsWanted wanted) {
  if (x.numel() == 0) return {};
  const int64_t ndim = x.dim();
  const Tensor scale = per_channel(invstd, ndim);
  const Tensor xhat = mul(sub(x, per_channel(mean, ndim)), scale);
  return affine_gradients(g, xhat, weight.defined() ? per_channel(weight, ndim) : Tensor(), all_but_channels(ndim),
                          wanted, [&](const Tensor& gh) { return mul(gh, scale); });
}

}  // namespace ember::autograd
