// Matrix products and their backward. Every gradient is itself a product through the same
// GEMM, fed transposed views (which the kernel reads in place) rather than transposed copies.
#include "autograd/node.h"
#include "core/autocast.h"
#include "core/native/linalg.h"
#include "core/ops.h"

namespace ember {
using autograd::Tensors;

namespace {

Tensor transposed(const Tensor& x) { return x.transpose(-1, -2); }

Shape leading(const Tensor& x, int64_t keep_last) { return Shape(x.shape().begin(), x.shape().end() - keep_last); }

// Sums g [batch..., r, c] over the batch dims that `shape` ([its batch..., r, c]) broadcast
// along, giving a tensor of `shape`.
Tensor reduce_to(const Tensor& g, const Shape& shape) {
  const int64_t lead = g.dim() - int64_t(shape.size());
  Shape dims;
  for (int64_t i = 0; i + 2 < g.dim(); ++i)
    if (i < lead || (shape[size_t(i - lead)] == 1 && g.shape()[size_t(i)] != 1)) dims.push_back(i);
  const Tensor s = dims.empty() ? g : sum(g, dims, /*keepdim=*/true);
  return s.reshape(shape);
}

// d(a @ b) for torch.matmul's promotion rules; returns {grad_a, grad_b} (undefined when unwanted).
Tensors matmul_backward(const Tensor& g, const Tensor& a, const Tensor& b, bool want_a, bool want_b) {
  // Redo the promotion so the gradient has [batch..., n, m] geometry.
  const Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
  const Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  const int64_t n = a2.size(-2), k = a2.size(-1), m = b2.size(-1);
  Shape full = broadcast_shapes(leading(a2, 2), leading(b2, 2), "matmul backward");
  const int64_t batches = numel_of(full);
  full.insert(full.end(), {n, m});
  const Tensor g2 = g.reshape(full);

  Tensor grad_a, grad_b;
  if (want_a) grad_a = reduce_to(matmul(g2, transposed(b2)), a2.shape()).reshape(a.shape());
  if (want_b) {
    if (b2.dim() == 2 && a2.dim() > 2) {
      // b is shared by every batch entry: one GEMM over all rows, [k, B*n] @ [B*n, m].
      const Tensor a_rows = a2.reshape({batches * n, k}), g_rows = g2.reshape({batches * n, m});
      grad_b = matmul(transposed(a_rows), g_rows).reshape(b.shape());
    } else {
      grad_b = reduce_to(matmul(transposed(a2), g2), b2.shape()).reshape(b.shape());
    }
  }
  return {grad_a, grad_b};
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = autocast::to_lower(a_in), b = autocast::to_lower(b_in);
  Tensor out = native::matmul(a, b);
  if (autograd::needs_grad({a, b})) {
    autograd::record("MatmulBackward", {a, b}, {out},
                     [sa = autograd::save(a), sb = autograd::save(b), want_a = a.requires_grad(),
                      want_b = b.requires_grad()](const Tensors& g) -> Tensors {
                       return matmul_backward(g[0], sa, sb, want_a, want_b);
                     });
  }
  return out;
}

Tensor bmm(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = autocast::to_lower(a_in), b = autocast::to_lower(b_in);
  Tensor out = native::bmm(a, b);
  if (autograd::needs_grad({a, b})) {
    autograd::record("BmmBackward", {a, b}, {out},
                     [sa = autograd::save(a), sb = autograd::save(b), want_a = a.requires_grad(),
                      want_b = b.requires_grad()](const Tensors& g) -> Tensors {
                       return {want_a ? bmm(g[0], transposed(sb)) : Tensor(),
                               want_b ? bmm(transposed(sa), g[0]) : Tensor()};
                     });
  }
  return out;
}

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
  const Tensor x = autocast::to_lower(x_in), weight = autocast::to_lower(weight_in), bias = autocast::to_lower(bias_in);
  Tensor out = native::linear(x, weight, bias);
  if (autograd::needs_grad({x, weight, bias})) {
    const bool want_x = x.requires_grad(), want_w = weight.requires_grad();
    const bool want_bias = bias.defined() && bias.requires_grad();
    autograd::record("LinearBackward", {x, weight, bias}, {out},
                     [sx = autograd::save(x), sw = autograd::save(weight), want_x, want_w,
                      want_bias](const Tensors& g) -> Tensors {
                       const int64_t in = sw.size(1), out_features = sw.size(0);
                       const int64_t rows = numel_of(leading(sx, 1));
                       // dx = g W (W shared by all rows: one GEMM); dW = g^T x over all rows.
                       Tensor gx = want_x ? matmul(g[0], sw) : Tensor();
                       const Tensor g_rows = g[0].reshape({rows, out_features});
                       Tensor gw = want_w ? matmul(transposed(g_rows), sx.reshape({rows, in})) : Tensor();
                       Tensor gb = want_bias ? sum(g_rows, {0}) : Tensor();
                       return {gx, gw, gb};
                     });
  }
  return out;
}

Tensor Tensor::matmul(const Tensor& other) const { return ember::matmul(*this, other); }

}  // namespace ember
