// The public, differentiable op functions. Each is defined in autograd/functions/<group>.cpp
// next to its backward formula; the forward work is done by core/native (shape checks,
// output allocation) and the per-device kernels it dispatches to.
#pragma once
#include <optional>
#include <utility>
#include <vector>

#include "core/conv_padding.h"
#include "core/tensor.h"

namespace ember {

// ---- elementwise binary (NumPy broadcasting, dtype promotion)
Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a + alpha * b
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a - alpha * b
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, double b);
Tensor pow(const Tensor& a, double exponent);
Tensor pow(const Tensor& a, const Tensor& exponent);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);

// ---- elementwise unary
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
// x where x > 0, else negative_slope * x (PyTorch's); floating-point input only.
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
Tensor gelu(const Tensor& x, bool tanh_approx = false);  // exact erf form by default
Tensor silu(const Tensor& x);                             // x * sigmoid(x)
Tensor abs(const Tensor& x);
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);

// ---- comparisons (bool results, not differentiable), selection
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

// ---- reductions (dims may be negative; empty dims = all dims)
Tensor sum(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor amax(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const Shape& dims = {}, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);  // i64 result
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor var(const Tensor& x, const Shape& dims = {}, int64_t correction = 1, bool keepdim = false);

// ---- linear algebra
Tensor matmul(const Tensor& a, const Tensor& b);  // 1-D to N-D, batch dims broadcast
Tensor bmm(const Tensor& a, const Tensor& b);     // [B,n,k] x [B,k,m]
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());  // x W^T + b

// ---- convolution (torch.nn.functional semantics; f32 and f64, bf16/f16 computed in f32)
// padding: numbers ({p} for every dim or {ph, pw}), "valid" (none) or "same" (output size =
// input size; stride must be 1; an odd total puts the extra row/column at the bottom/right, as
// in PyTorch). stride, dilation: {s} for every dim or {sh, sw}.
// input [N, C, H, W] or unbatched [C, H, W]; weight [O, C / groups, kH, kW]; bias [O] or undefined.
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(), const Shape& stride = {1, 1},
              const ConvPadding& padding = {0, 0}, const Shape& dilation = {1, 1}, int64_t groups = 1);
// input [N, C, L] or unbatched [C, L]; weight [O, C / groups, K]; bias [O] or undefined.
Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(), int64_t stride = 1,
              const ConvPadding& padding = 0, int64_t dilation = 1, int64_t groups = 1);
// input [N, Cin, H, W] or unbatched [Cin, H, W]; weight [Cin, Cout / groups, kH, kW]; output size
// per dim (H - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1, with
// output_padding < stride or < dilation.
Tensor conv_transpose2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
                        const Shape& stride = {1, 1}, const Shape& padding = {0, 0},
                        const Shape& output_padding = {0, 0}, int64_t groups = 1, const Shape& dilation = {1, 1});

// ---- neural-network functions
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
// input [N, C, *]; running_mean / running_var [C] or undefined. In training the batch statistics
// normalise, and given running statistics are updated in place (as torch):
//   running = (1 - momentum) * running + momentum * batch statistic (the variance unbiased).
// Not in training, the running statistics normalise (they must be given).
Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5);
// input [N, C, *], normalised over each group of C / num_groups channels; weight / bias [C].
Tensor group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
// x / sqrt(mean(x^2 over the trailing normalized_shape) + eps) * weight; eps nullopt is the
// machine epsilon of x's dtype (f32's for 16-bit inputs, which compute in float), as torch.
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                std::optional<double> eps = std::nullopt);
Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx = std::nullopt);
Tensor dropout(const Tensor& x, double p, bool training);
// logits [N, C] or [N, C, d1...]; target class indices (i64) of shape [N] or [N, d1...].
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                     double label_smoothing = 0.0, Reduction reduction = Reduction::Mean);

// {logits, loss} = {linear(x, weight, bias), cross_entropy(logits viewed [rows, out], target
// flattened, ...)}: x [..., in], weight [out, in], bias [out] or undefined, target (i64/i32) with
// one class index per row of x (numel(x) / in of them). Both results equal the composition's,
// gradients included, but on the CPU the loss's backward writes the logits' gradient once and
// forms the bias gradient from it in the same pass (column sums as the rows are written), and
// the bias enters in the product's epilogue. The logits stay differentiable through their own
// linear node, which runs only when a gradient reaches them. Autocast applies as to the
// composition. Other devices run the composition itself.
std::pair<Tensor, Tensor> linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                               const Tensor& target, int64_t ignore_index = -100,
                                               double label_smoothing = 0.0, Reduction reduction = Reduction::Mean);

// ---- pooling over the last two dims of [N, C, H, W] or [C, H, W] input (PyTorch semantics).
// A one-number size {k} means {k, k}; an empty stride means stride = kernel_size. ceil_mode
// rounds the output size up, keeping only windows that start inside the input or left padding.
// max_pool2d: NaN counts as the maximum; ties go to the first maximum in row-major window order.
Tensor max_pool2d(const Tensor& input, const Shape& kernel_size, const Shape& stride = {},
                  const Shape& padding = {0, 0}, const Shape& dilation = {1, 1}, bool ceil_mode = false);
// count_include_pad: divide by the window clipped to the padded input (true) or to the input (false).
Tensor avg_pool2d(const Tensor& input, const Shape& kernel_size, const Shape& stride = {},
                  const Shape& padding = {0, 0}, bool ceil_mode = false, bool count_include_pad = true);
// Output cell i of a dim of size n -> m averages input [floor(i n / m), ceil((i + 1) n / m)).
Tensor adaptive_avg_pool2d(const Tensor& input, const Shape& output_size);

// ---- joining, splitting, indexing
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
Tensor one_hot(const Tensor& indices, int64_t num_classes = -1);  // i64 result

// ---- fused: each equals the composition in its comment (for the same generator state the
// dropout keeps the same elements), computed in one or two passes over memory instead of one
// pass per op. The CPU runs dedicated kernels; other devices run the composition itself.

// gelu(x + bias) with bias [C] added along the last dim of x [..., C]. Under autocast the bias
// is cast as linear's is, so the result keeps x's lower-precision dtype; otherwise the dtypes
// of x and bias promote.
Tensor bias_gelu(const Tensor& x, const Tensor& bias, bool tanh_approx = false);
// layer_norm(dropout(x + x_bias, dropout_p, training) + residual, normalized_shape, weight, bias, eps).
// x_bias (shape normalized_shape) may be undefined; residual broadcasts to x. x and residual may
// differ in dtype (say a bf16 sublayer output and an f32 residual stream): the sum is formed and
// normalised in float, and the result has their promoted dtype, or f32 under autocast (the
// policy of layer_norm).
Tensor add_layer_norm(const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                      const Tensor& weight = Tensor(), const Tensor& bias = Tensor(), double eps = 1e-5,
                      double dropout_p = 0.0, bool training = false, const Tensor& x_bias = Tensor());
// dropout(softmax(x * scale + mask, -1), dropout_p, training), the attention-score softmax: mask
// is additive (0 keeps, a large negative value drops), broadcasts to x, and may be undefined.
// The result is f32 under autocast (the policy of softmax), else the promoted dtype of x and mask;
// `dtype` asks for another one instead (the values are those of the default dtype, rounded once),
// as torch.softmax(dtype=) does: the attention product that follows wants them in the autocast dtype.
Tensor scaled_masked_softmax(const Tensor& x, const Tensor& mask, double scale, double dropout_p = 0.0,
                             bool training = false, std::optional<DType> dtype = std::nullopt);
// Multi-head self-attention on one packed projection: qkv [B, L, 3E] holds [q | k | v] (what one
// linear layer with the query, key and value weights stacked produces), E = num_heads * D, head h
// taking columns h D .. h D + D - 1 of each third. The result [B, L, E] equals
//   q, k, v = each third viewed as [B, L, num_heads, D], transposed to [B, num_heads, L, D];
//   (dropout(softmax(q k^T / sqrt(D) + mask, -1), dropout_p, training) v).transpose(1, 2).reshape({B, L, E})
// with mask broadcasting to [B, num_heads, L, L] (or undefined), but never materialises the
// per-head copies, the scores or the probabilities. Under autocast the products run in the
// autocast dtype, the softmax in f32, as in the composition.
Tensor packed_self_attention(const Tensor& qkv, int64_t num_heads, const Tensor& mask = Tensor(),
                             double dropout_p = 0.0, bool training = false);
// torch.nn.functional.scaled_dot_product_attention:
//   dropout(softmax(q k^T * scale + mask, -1), dropout_p) v
// with q [..., L, E], k [..., S, E], v [..., S, Ev] (leading dims broadcast), result [..., L, Ev].
// attn_mask is bool (true takes part) or additive floating, broadcastable to [..., L, S], or
// undefined; is_causal masks key j from query i when j > i (top-left aligned; not together with
// attn_mask); scale defaults to 1 / sqrt(E). Dropout applies whenever dropout_p > 0, as in torch.
// The scores and probabilities are never materialised on the CPU; causal rows skip the keys they
// cannot see. Under autocast the products run in the autocast dtype, the softmax in f32.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask = Tensor(), double dropout_p = 0.0, bool is_causal = false,
                                    std::optional<double> scale = std::nullopt);

// ---- operators
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, double b) { return div(a, b); }
inline Tensor operator+(double a, const Tensor& b) { return add(b, a); }
inline Tensor operator-(double a, const Tensor& b) { return add(neg(b), a); }
inline Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
inline Tensor operator/(double a, const Tensor& b) { return mul(pow(b, -1.0), a); }
inline Tensor operator-(const Tensor& x) { return neg(x); }

}  // namespace ember
