// Softmax, log-softmax and layer normalisation without autograd, plus their backward
// passes (dedicated kernels: these sit on the transformer hot path).
//
// Softmax geometry: a contiguous tensor viewed as [outer, len, inner], normalising along len.
// inner == 1 is the common case (last dim) and runs row by row.
#pragma once
#include "core/dispatch.h"
#include "core/tensor.h"

namespace ember::native {

struct SoftmaxGeometry {
  int64_t outer = 1, len = 1, inner = 1;
};

// out = softmax (or log_softmax when `log`) of x along len; both contiguous, same dtype.
EMBER_DECLARE_STUB(softmax_stub, void (*)(const Tensor& out, const Tensor& x, const SoftmaxGeometry& g, bool log));
// grad_in from grad_out and the forward output y (all contiguous, same dtype):
//   softmax:      grad_in = y * (grad_out - sum(grad_out * y))
//   log_softmax:  grad_in = grad_out - exp(y) * sum(grad_out)
EMBER_DECLARE_STUB(softmax_backward_stub, void (*)(const Tensor& grad_in, const Tensor& grad_out, const Tensor& y,
                                                   const SoftmaxGeometry& g, bool log));

// Layer norm over rows of `cols` elements of contiguous x [rows, cols]: writes y (x's dtype)
// and per-row mean and rstd = 1/sqrt(var + eps) (f64 for f64 input, f32 otherwise). weight and
// bias are undefined or contiguous [cols] in the statistics' dtype.
EMBER_DECLARE_STUB(layer_norm_stub, void (*)(const Tensor& y, const Tensor& mean, const Tensor& rstd,
                                             const Tensor& x, const Tensor& weight, const Tensor& bias,
                                             int64_t rows, int64_t cols, double eps));
// From grad [rows, cols] (x's dtype, contiguous): dx (x's dtype), dweight and dbias ([cols],
// statistics' dtype). Any output may be undefined to skip it; weight undefined means ones.
//   dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)),  dweight = sum_rows g*xhat,  dbias = sum_rows g
EMBER_DECLARE_STUB(layer_norm_backward_stub,
                   void (*)(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& grad,
                            const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                            int64_t rows, int64_t cols));

// ---- batch norm, group norm, RMS norm
//
// Channel geometry: a contiguous [N, C, *] tensor viewed as [n, c, s] (s = the product of the
// spatial dims). "stats dtype" below is f64 for f64 input and f32 otherwise.
struct ChannelGeometry {
  int64_t n = 1, c = 1, s = 1;
};

// sum[c] and sumsq[c] (f64 [C]) of x over n and s.
EMBER_DECLARE_STUB(batch_norm_stats_stub,
                   void (*)(const Tensor& sum, const Tensor& sumsq, const Tensor& x, const ChannelGeometry& g));
// From the (global) sums and count (f64 [C], [C], [1]): mean = sum / count and
// invstd = 1 / sqrt(sumsq / count - mean^2 + eps) (stats dtype, [C]); running_mean and
// running_var (stats dtype, contiguous, or undefined) move towards mean and the unbiased variance.
EMBER_DECLARE_STUB(batch_norm_gather_stub,
                   void (*)(const Tensor& mean, const Tensor& invstd, const Tensor& running_mean,
                            const Tensor& running_var, const Tensor& sum, const Tensor& sumsq, const Tensor& count,
                            int64_t channels, double momentum, double eps));
// y = (x - mean[c]) * invstd[c] * weight[c] + bias[c]; y, x in x's dtype, the rest [C] in the
// stats dtype (weight, bias may be undefined).
EMBER_DECLARE_STUB(batch_norm_elemt_stub,
                   void (*)(const Tensor& y, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                            const Tensor& weight, const Tensor& bias, const ChannelGeometry& g));
// sum_dy[c] = sum dy, sum_dy_xmu[c] = sum dy * (x - mean[c]) over n and s (f64 [C]).
EMBER_DECLARE_STUB(batch_norm_backward_reduce_stub,
                   void (*)(const Tensor& sum_dy, const Tensor& sum_dy_xmu, const Tensor& dy, const Tensor& x,
                            const Tensor& mean, const ChannelGeometry& g));
// dx = (dy - sum_dy / count - (x - mean) * invstd^2 * sum_dy_xmu / count) * invstd * weight;
// with sum_dy and sum_dy_xmu undefined (fixed statistics) dx = dy * invstd * weight.
EMBER_DECLARE_STUB(batch_norm_backward_elemt_stub,
                   void (*)(const Tensor& dx, const Tensor& dy, const Tensor& x, const Tensor& mean,
                            const Tensor& invstd, const Tensor& weight, const Tensor& sum_dy,
                            const Tensor& sum_dy_xmu, const Tensor& count, const ChannelGeometry& g));

// Batch norm in training, one kernel per direction where the device has one (the CPU): the
// values of the pieces, bit for bit, from fewer passes over the data. Each returns false,
// having written nothing, when it does not take the problem (the caller then runs the pieces).
// x, y, dy and dx are contiguous [n, c, s] in x's dtype; the [C] tensors are contiguous, in the
// stats dtype but for the f64 sums.
// Forward: y, mean and invstd as batch_norm_stats + batch_norm_gather_stats + batch_norm_elemt
// give them over this input alone, running_mean and running_var (or both undefined) updated.
EMBER_DECLARE_STUB(batch_norm_fused_forward_stub,
                   bool (*)(const Tensor& y, const Tensor& mean, const Tensor& invstd, const Tensor& running_mean,
                            const Tensor& running_var, const Tensor& x, const Tensor& weight, const Tensor& bias,
                            const ChannelGeometry& g, double momentum, double eps));
// Backward: sum_dy and sum_dy_xmu as batch_norm_backward_reduce_stub gives them and dx as
// batch_norm_backward_elemt_stub does from them, the count being n * s.
EMBER_DECLARE_STUB(batch_norm_fused_backward_stub,
                   bool (*)(const Tensor& dx, const Tensor& sum_dy, const Tensor& sum_dy_xmu, const Tensor& dy,
                            const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                            const ChannelGeometry& g));

// Batch norm in one library call: cuDNN's on CUDA (no CPU kernel: the pieces above serve
// there). Each returns false, having written nothing, when the library does not take the problem
// (dtype, sizes, eps, or the library switched off); the caller then runs the pieces. x, y, dy
// and dx are contiguous [n, c, s] in x's dtype (f32, f16 or bf16); every [C] tensor is
// contiguous f32, weight and bias always given (ones and zeros for a layer without affine).
// Training: y from the batch statistics, save_mean and save_invstd = 1 / sqrt(biased variance +
// eps), running_mean and running_var (or both undefined) moved towards the batch mean and the
// unbiased variance with momentum. Evaluation: y from running_mean and running_var; save_mean and
// save_invstd undefined.
EMBER_DECLARE_STUB(batch_norm_library_forward_stub,
                   bool (*)(const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd, const Tensor& x,
                            const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                            const Tensor& running_var, const ChannelGeometry& g, bool training, double momentum,
                            double eps));
// The training forward's gradients from its save_mean and save_invstd: dx, dweight and dbias
// (all written), the eps the forward used.
EMBER_DECLARE_STUB(batch_norm_library_backward_stub,
                   bool (*)(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                            const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                            const Tensor& save_invstd, const ChannelGeometry& g, double eps));

// Group norm of contiguous x viewed as [n, c, s] with `groups` groups of c / groups channels:
// y in x's dtype, per-(sample, group) mean and rstd [n * groups] (stats dtype); weight and bias
// [c] (stats dtype) or undefined.
EMBER_DECLARE_STUB(group_norm_stub, void (*)(const Tensor& y, const Tensor& mean, const Tensor& rstd,
                                             const Tensor& x, const Tensor& weight, const Tensor& bias,
                                             const ChannelGeometry& g, int64_t groups, double eps));
// dx (x's dtype), dweight, dbias ([c], stats dtype); any may be undefined to skip it.
EMBER_DECLARE_STUB(group_norm_backward_stub,
                   void (*)(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                            const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                            const ChannelGeometry& g, int64_t groups));

// RMS norm over rows of `cols` elements of contiguous x: y (x's dtype) and per-row
// rstd = 1 / sqrt(mean(x^2) + eps) (stats dtype); weight [cols] (stats dtype) or undefined.
EMBER_DECLARE_STUB(rms_norm_stub, void (*)(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                                           int64_t rows, int64_t cols, double eps));
// dx = rstd * (dy w - xhat mean(dy w xhat)), xhat = x rstd; dweight = sum_rows dy xhat. Either
// output may be undefined.
EMBER_DECLARE_STUB(rms_norm_backward_stub,
                   void (*)(const Tensor& dx, const Tensor& dweight, const Tensor& dy, const Tensor& x,
                            const Tensor& rstd, const Tensor& weight, int64_t rows, int64_t cols));

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// `y` is the forward output; the result has y's shape and dtype.
Tensor softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim);
Tensor log_softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim);

struct LayerNormResult {
  Tensor y;
  Tensor mean, rstd;  // [rows], saved for backward
};
LayerNormResult layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                           const Tensor& bias, double eps);

struct LayerNormGrads {
  Tensor dx, dweight, dbias;  // dweight / dbias in the dtype of weight / bias
};
// Needs: which gradients to compute. weight / bias as passed to layer_norm (may be undefined).
LayerNormGrads layer_norm_backward(const Tensor& grad, const Tensor& x, const Shape& normalized_shape,
                                   const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                                   const Tensor& bias, bool need_dx, bool need_dweight, bool need_dbias);

// ---- batch norm in pieces. batch_norm is made of them, and so can a synchronised batch norm
// that all-reduces BatchNormStats.sum / sumsq / count and BatchNormReduced.sum_dy / sum_dy_xmu
// across ranks between the pieces. None records autograd; input is [N, C, *] of any layout.

// The channel geometry of an [N, C, *] input, after checking its rank ("op: ..." errors).
ChannelGeometry channel_geometry(const Tensor& input, const char* op);

struct BatchNormStats {
  Tensor sum, sumsq;  // f64 [C]
  Tensor count;       // f64 [1]: N * prod(spatial dims)
};
// Per-channel sums of the input and its squares, and the number of values per channel.
BatchNormStats batch_norm_stats(const Tensor& input);

struct BatchNormMeanInvstd {
  Tensor mean, invstd;  // [C], f64 for f64 input, f32 otherwise
};
// Mean and 1 / sqrt(biased variance + eps) from the sums (local or all-reduced); updates
// running_mean / running_var ([C], any floating dtype, or undefined) in place with momentum and
// the unbiased variance. x_dtype is the input's dtype (it picks the statistics' dtype).
BatchNormMeanInvstd batch_norm_gather_stats(const BatchNormStats& stats, DType x_dtype, const Tensor& running_mean,
                                            const Tensor& running_var, double momentum, double eps);

// (input - mean) * invstd * weight + bias per channel, in input's dtype. weight and bias [C] or
// undefined; mean and invstd as batch_norm_gather_stats returns them.
Tensor batch_norm_elemt(const Tensor& input, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                        const Tensor& bias);

struct BatchNormReduced {
  Tensor sum_dy, sum_dy_xmu;  // f64 [C]: sum(dy), sum(dy * (x - mean)) over this process's input
  Tensor dweight, dbias;      // [C] in weight's / bias's dtype, when asked for (else undefined)
};
BatchNormReduced batch_norm_backward_reduce(const Tensor& grad_out, const Tensor& input, const Tensor& mean,
                                            const Tensor& invstd, const Tensor& weight, const Tensor& bias,
                                            bool need_dweight, bool need_dbias);

// The input gradient from the (global) sum_dy, sum_dy_xmu and count; with sum_dy and
// sum_dy_xmu undefined, the gradient for fixed statistics (evaluation mode): dy * invstd * weight.
Tensor batch_norm_backward_elemt(const Tensor& grad_out, const Tensor& input, const Tensor& mean,
                                 const Tensor& invstd, const Tensor& weight, const Tensor& sum_dy,
                                 const Tensor& sum_dy_xmu, const Tensor& count);

// The shape, dtype and device checks of batch_norm's arguments alone: input [N, C, *] floating,
// running statistics and affine parameters (each may be undefined) of shape [C] on its device.
// A synchronised batch norm checks these locally; its values per channel count over all ranks.
void check_batch_norm_params(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                             const Tensor& weight, const Tensor& bias);
// Checks batch_norm's arguments (running statistics and affine parameters of shape [C]) and, in
// training, that each channel has more than one value.
void check_batch_norm_args(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                           const Tensor& weight, const Tensor& bias, bool training);
// Mean and invstd of fixed (running) statistics: running_mean and 1 / sqrt(running_var + eps).
BatchNormMeanInvstd batch_norm_fixed_stats(const Tensor& running_mean, const Tensor& running_var, DType x_dtype,
                                           double eps);

// Training batch_norm over this input alone through batch_norm_fused_forward_stub, where the
// device has a kernel that takes the problem; `done` false (nothing computed, running
// statistics untouched) otherwise. Arguments as batch_norm's, already checked; running
// statistics of any floating dtype are updated in place. y, mean, invstd and count are those the
// pieces give (batch_norm_stats' count).
struct BatchNormFusedForward {
  bool done = false;
  Tensor y;
  BatchNormMeanInvstd stats;
  Tensor count;
};
BatchNormFusedForward batch_norm_fused_forward(const Tensor& input, const Tensor& weight, const Tensor& bias,
                                               const Tensor& running_mean, const Tensor& running_var, double momentum,
                                               double eps);
// The gradients of a training batch_norm over this input alone from its mean and invstd, through
// batch_norm_fused_backward_stub; `done` false where no kernel takes the problem. dx always;
// dweight / dbias as batch_norm_backward_reduce gives them (reduced.sum_dy and sum_dy_xmu too).
struct BatchNormFusedGrads {
  bool done = false;
  Tensor dx;
  BatchNormReduced reduced;
};
BatchNormFusedGrads batch_norm_fused_backward(const Tensor& grad_out, const Tensor& input, const Tensor& mean,
                                              const Tensor& invstd, const Tensor& weight, const Tensor& bias,
                                              bool need_dweight, bool need_dbias);

// batch_norm whole through the device's library (batch_norm_library_forward_stub) where it has
// one that takes the problem; `done` false (nothing computed, running statistics untouched)
// otherwise. Arguments as batch_norm's, already checked by check_batch_norm_args; running
// statistics of any floating dtype are updated in place in training.
struct BatchNormLibraryForward {
  bool done = false;
  Tensor y;
  Tensor mean, invstd;  // training only: [C] f32, for batch_norm_library_backward
};
BatchNormLibraryForward batch_norm_library_forward(const Tensor& input, const Tensor& weight, const Tensor& bias,
                                                   const Tensor& running_mean, const Tensor& running_var,
                                                   bool training, double momentum, double eps);
// The gradients of a training batch_norm_library_forward from its mean and invstd; `done` false
// when the library declines (the pieces then compute them from the same mean and invstd).
// dweight / dbias in weight's / bias's dtype, when asked for and the parameter is defined.
struct BatchNormLibraryGrads {
  bool done = false;
  Tensor dx, dweight, dbias;
};
BatchNormLibraryGrads batch_norm_library_backward(const Tensor& grad_out, const Tensor& input, const Tensor& weight,
                                                  const Tensor& bias, const Tensor& mean, const Tensor& invstd,
                                                  double eps, bool need_dweight, bool need_dbias);

struct GroupNormResult {
  Tensor y;
  Tensor mean, rstd;  // [N * num_groups], saved for backward
};
GroupNormResult group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight, const Tensor& bias,
                           double eps);
struct GroupNormGrads {
  Tensor dx, dweight, dbias;
};
GroupNormGrads group_norm_backward(const Tensor& grad_out, const Tensor& input, int64_t num_groups,
                                   const Tensor& mean, const Tensor& rstd, const Tensor& weight, const Tensor& bias,
                                   bool need_dx, bool need_dweight, bool need_dbias);

struct RmsNormResult {
  Tensor y;
  Tensor rstd;  // [rows], saved for backward
};
RmsNormResult rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, double eps);
// The eps rms_norm uses when none is given: the machine epsilon of the dtype it computes in.
double rms_norm_default_eps(DType x_dtype);
struct RmsNormGrads {
  Tensor dx, dweight;
};
RmsNormGrads rms_norm_backward(const Tensor& grad_out, const Tensor& x, const Shape& normalized_shape,
                               const Tensor& rstd, const Tensor& weight, bool need_dx, bool need_dweight);

}  // namespace ember::native
