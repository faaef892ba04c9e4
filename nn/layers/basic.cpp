#include "nn/layers/basic.h"

#include <cmath>

#include "core/sparse_grad.h"
#include "nn/init.h"

namespace ember::nn {

Linear::Linear(int64_t in, int64_t out, LinearOptions opt)
    : Module("Linear"), in_features(in), out_features(out) {
  EMBER_CHECK(in > 0 && out > 0, "Linear: features must be positive, got in=", in, " out=", out);
  weight = register_parameter("weight", empty({out, in}, {opt.dtype}));
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (opt.bias) {
    bias = register_parameter("bias", empty({out}, {opt.dtype}));
    const double bound = 1.0 / std::sqrt(double(in));
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Linear::forward(const Tensor& x) {
  auto scope = enter_forward();
  return scope.exit(linear(x, weight, bias));
}

Embedding::Embedding(int64_t n, int64_t dim, std::optional<int64_t> pad, bool sparse)
    : Module("Embedding"), num_embeddings(n), embedding_dim(dim), padding_idx(pad) {
  EMBER_CHECK(n > 0 && dim > 0, "Embedding: sizes must be positive, got ", n, " x ", dim);
  if (pad) {
    EMBER_CHECK(*pad >= -n && *pad < n, "Embedding: padding_idx ", *pad, " out of range for ", n, " embeddings");
    if (*pad < 0) padding_idx = *pad + n;
  }
  weight = register_parameter("weight", empty({n, dim}));
  init::normal_(weight);
  if (padding_idx) {
    NoGradGuard ng;
    weight.select(0, *padding_idx).zero_();
  }
  if (sparse) weight.set_row_sparse_grad();
}

Tensor Embedding::forward(const Tensor& indices) {
  auto scope = enter_forward();
  // Hooks on the weight (DDP's, FSDP's, a user's) expect the dense gradient to arrive; on a GPU
  // the rows would cost a trip through the host, and the dense kernels are fast there.
  if (row_sparse_backward && weight.is_leaf() && weight.hook_count() == 0 && weight.device().is_cpu()) {
    if (!weight.dense_grad_part().defined())
      return scope.exit(embedding_with_row_sparse_backward(weight, indices, padding_idx));
    // A dense use (a tied decoder) left a gradient in an earlier micro-batch. The dense path adds
    // each pass's lookup gradient to that pass's decoder gradient before accumulating; rows kept
    // apart would be summed in another order. So this pass goes dense, the earlier rows added in
    // first, and only the first micro-batch of a step skips the table.
    if (weight.has_sparse_grad()) weight.grad();
  }
  return scope.exit(embedding(weight, indices, padding_idx));
}

LayerNorm::LayerNorm(Shape shape, double eps_, bool affine)
    : Module("LayerNorm"), normalized_shape(std::move(shape)), eps(eps_) {
  if (affine) {
    weight = register_parameter("weight", ones(normalized_shape));
    bias = register_parameter("bias", zeros(normalized_shape));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  auto scope = enter_forward();
  return scope.exit(layer_norm(x, normalized_shape, weight, bias, eps));
}

Dropout::Dropout(double p_) : Module("Dropout"), p(p_) {
  EMBER_CHECK(p >= 0.0 && p <= 1.0, "Dropout: probability must be in [0, 1], got ", p);
}

Tensor Dropout::forward(const Tensor& x) {
  auto scope = enter_forward();
  return scope.exit(dropout(x, p, is_training()));
}

}  // namespace ember::nn
