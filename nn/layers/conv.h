// Convolution layers: Conv1d, Conv2d and ConvTranspose2d, as torch.nn's, over the functional
// ops of core/ops.h. Parameters `weight` and `bias` with PyTorch's default initialisation.
#pragma once
#include "core/conv_padding.h"
#include "nn/module.h"

namespace ember::nn {

// kernel_size, stride, dilation (and output_padding): one value for every spatial dim, or one
// per dim, as PyTorch takes an int or a tuple; padding as well, or "same" / "valid".
struct ConvOptions {
  int64_t in_channels = 1;
  int64_t out_channels = 1;
  Shape kernel_size = {1};
  Shape stride = {1};
  ConvPadding padding = 0;
  Shape dilation = {1};
  int64_t groups = 1;
  bool bias = true;
  Shape output_padding = {0};  // ConvTranspose2d only
  DType dtype = DType::f32;
};

// What the three layers share: the options checked, the parameters created and initialised.
class ConvNd : public Module {
 public:
  Tensor weight, bias;
  ConvOptions options;

 protected:
  // spatial: 1 or 2; transposed: weight [in, out / groups, k...] instead of [out, in / groups, k...].
  ConvNd(const char* type_name, ConvOptions opt, int64_t spatial, bool transposed);
  // A per-dim option with `spatial` values (a single value repeated).
  Shape per_dim(const Shape& v) const;
  int64_t spatial_;
};

class Conv1d : public ConvNd {
 public:
  explicit Conv1d(ConvOptions opt);
  Tensor forward(const Tensor& x) override;  // [N, C, L] or [C, L]
};

class Conv2d : public ConvNd {
 public:
  explicit Conv2d(ConvOptions opt);
  Tensor forward(const Tensor& x) override;  // [N, C, H, W] or [C, H, W]
};

class ConvTranspose2d : public ConvNd {
 public:
  explicit ConvTranspose2d(ConvOptions opt);
  Tensor forward(const Tensor& x) override;  // [N, C, H, W] or [C, H, W]
};

}  // namespace ember::nn
