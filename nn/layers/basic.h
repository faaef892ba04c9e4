// Basic layers: Linear, Embedding, LayerNorm, Dropout, Flatten, activations and Softmax.
#pragma once
#include <optional>

#include "core/grad_mode.h"
#include "nn/module.h"

namespace ember::nn {

struct LinearOptions {
  bool bias = true;
  DType dtype = DType::f32;
};

// y = x W^T + b; weight [out_features, in_features]. PyTorch's default initialisation.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, LinearOptions opt = {});
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  int64_t in_features, out_features;
};

class Embedding : public Module {
 public:
  // sparse: lookups leave the weight a row-sparse gradient (the rows they read; see
  // core/sparse_grad.h), as torch.nn.Embedding(sparse=True) does; DDP then all-gathers those
  // rows instead of all-reducing the table.
  Embedding(int64_t num_embeddings, int64_t embedding_dim, std::optional<int64_t> padding_idx = std::nullopt,
            bool sparse = false);
  Tensor forward(const Tensor& indices) override;
  void set_sparse(bool on) { weight.set_row_sparse_grad(on); }
  bool sparse() const { return weight.row_sparse_grad(); }
  // An internal speed-up, not torch's sparse=True: lookups leave the weight the rows they read
  // (core/sparse_grad.h), not a zero-filled table; grad() still reads dense, sparse() is false.
  // Optimizers, clip_grad_norm_ and GradScaler read the rows, equal to the dense path bit for bit.
  // Only for a CPU weight without post-accumulate hooks (DDP's, FSDP's: they get the dense
  // gradient) and no dense gradient yet (a tied decoder's from an earlier micro-batch: that pass
  // goes dense). BERT's and GPT-2's word embeddings turn it on.
  bool row_sparse_backward = false;
  Tensor weight;
  int64_t num_embeddings, embedding_dim;
  std::optional<int64_t> padding_idx;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  Shape normalized_shape;
  double eps;
};

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  double p;
};

class GELU : public Module {
 public:
  explicit GELU(bool tanh_approx = false) : Module("GELU"), tanh_approx(tanh_approx) {}
  Tensor forward(const Tensor& x) override {
    auto scope = enter_forward();
    return scope.exit(gelu(x, tanh_approx));
  }
  bool tanh_approx;
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override {
    auto scope = enter_forward();
    return scope.exit(relu(x));
  }
};

// x where x > 0, else negative_slope * x.
class LeakyReLU : public Module {
 public:
  explicit LeakyReLU(double negative_slope = 0.01) : Module("LeakyReLU"), negative_slope(negative_slope) {}
  Tensor forward(const Tensor& x) override {
    auto scope = enter_forward();
    return scope.exit(leaky_relu(x, negative_slope));
  }
  double negative_slope;
};

class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& x) override {
    auto scope = enter_forward();
    return scope.exit(tanh(x));
  }
};

class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& x) override {
    auto scope = enter_forward();
    return scope.exit(silu(x));
  }
};

class Softmax : public Module {
 public:
  explicit Softmax(int64_t dim) : Module("Softmax"), dim(dim) {}
  Tensor forward(const Tensor& x) override {
    auto scope = enter_forward();
    return scope.exit(softmax(x, dim));
  }
  int64_t dim;
};

// Dims start_dim..end_dim (negative counts from the end) merged into one, as torch.nn.Flatten:
// a view of x when its strides allow, else a copy.
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : Module("Flatten"), start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& x) override {
    auto scope = enter_forward();
    return scope.exit(x.flatten(start_dim, end_dim));
  }
  int64_t start_dim, end_dim;
};

}  // namespace ember::nn
