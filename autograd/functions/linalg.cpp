// Matrix products and their backward. Every gradient is itself a product through the same
// GEMM, fed transposed views (which the kernel reads in place) rather than transposed copies.
// Those are differentiable ops on inputs saved with their history, so the gradients can be
// differentiated again (create_graph).
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
// As in PyTorch, b is read only for grad_a and a only for grad_b, so each is saved (and checked
// for in-place changes) only when that gradient is wanted; the geometry comes from the shapes.
Tensors matmul_backward(const Tensor& g, const autograd::SavedTensor& sa, const autograd::SavedTensor& sb,
                        const Shape& a_shape, const Shape& b_shape, bool want_a, bool want_b) {
  // Redo the promotion so the gradient has [batch..., n, m] geometry.
  const Shape a2 = a_shape.size() == 1 ? Shape{1, a_shape[0]} : a_shape;
  const Shape b2 = b_shape.size() == 1 ? Shape{b_shape[0], 1} : b_shape;
  const int64_t n = a2[a2.size() - 2], k = a2.back(), m = b2.back();
  Shape full = broadcast_shapes(Shape(a2.begin(), a2.end() - 2), Shape(b2.begin(), b2.end() - 2), "matmul backward");
  const int64_t batches = numel_of(full);
  full.insert(full.end(), {n, m});
  const Tensor g2 = g.reshape(full);

  Tensor grad_a, grad_b;
  if (want_a) {
    const Tensor b = sb.unpack();
    grad_a = reduce_to(matmul(g2, transposed(b.dim() == 1 ? b.unsqueeze(1) : b)), a2).reshape(a_shape);
  }
  if (want_b) {
    const Tensor a_saved = sa.unpack();
    const Tensor a = a_saved.dim() == 1 ? a_saved.unsqueeze(0) : a_saved;
    if (b2.size() == 2 && a2.size() > 2) {
      // b is shared by every batch entry: one GEMM over all rows, [k, B*n] @ [B*n, m].
      const Tensor a_rows = a.reshape({batches * n, k}), g_rows = g2.reshape({batches * n, m});
      grad_b = matmul(transposed(a_rows), g_rows).reshape(b_shape);
    } else {
      grad_b = reduce_to(matmul(transposed(a), g2), b2).reshape(b_shape);
    }
  }
  return {grad_a, grad_b};
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = autocast::to_lower(a_in), b = autocast::to_lower(b_in);
  Tensor out = native::matmul(a, b);
  if (autograd::needs_grad({a, b})) {
    const bool want_a = a.requires_grad(), want_b = b.requires_grad();
    autograd::record("MatmulBackward", {a, b}, {out},
                     [sa = autograd::save_with_history(want_b ? a : Tensor()), sb = autograd::save_with_history(want_a ? b : Tensor()),
                      a_shape = a.shape(), b_shape = b.shape(), want_a, want_b](const Tensors& g) -> Tensors {
                       return matmul_backward(g[0], sa, sb, a_shape, b_shape, want_a, want_b);
                     },
                     autograd::Backward::differentiable);
  }
  return out;
}

Tensor bmm(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = autocast::to_lower(a_in), b = autocast::to_lower(b_in);
  Tensor out = native::bmm(a, b);
  if (autograd::needs_grad({a, b})) {
    const bool want_a = a.requires_grad(), want_b = b.requires_grad();
    autograd::record("BmmBackward", {a, b}, {out},
                     [sa = autograd::save_with_history(want_b ? a : Tensor()), sb = autograd::save_with_history(want_a ? b : Tensor()), want_a,
                      want_b](const Tensors& g) -> Tensors {
                       return {want_a ? bmm(g[0], transposed(sb.unpack())) : Tensor(),
                               want_b ? bmm(transposed(sa.unpack()), g[0]) : Tensor()};
                     },
                     autograd::Backward::differentiable);
  }
  return out;
}

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
  const Tensor x = autocast::to_lower(x_in), weight = autocast::to_lower(weight_in), bias = autocast::to_lower(bias_in);
  Tensor out = native::linear(x, weight, bias);
  if (autograd::needs_grad({x, weight, bias})) {
    const bool want_x = x.requires_grad(), want_w = weight.requires_grad();
    const bool want_bias = bias.defined() && bias.requires_grad();
    const int64_t in = weight.size(1), out_features = weight.size(0);
    const int64_t rows = numel_of(leading(x, 1));
    // x is read only for dW and W only for dx, so each is saved only when that one is wanted.
    autograd::record("LinearBackward", {x, weight, bias}, {out},
                     [sx = autograd::save_with_history(want_w ? x : Tensor()),
                      sw = autograd::save_with_history(want_x ? weight : Tensor()),
                      in, out_features, rows, want_x, want_w, want_bias](const Tensors& g) -> Tensors {
                       // dx = g W (W shared by all rows: one GEMM); dW = g^T x over all rows.
                       Tensor gx = want_x ? matmul(g[0], sw.unpack()) : Tensor();
                       const Tensor g_rows = g[0].reshape({rows, out_features});
                       Tensor gw = want_w ? matmul(transposed(g_rows), sx.unpack().reshape({rows, in})) : Tensor();
                       Tensor gb = want_bias ? sum(g_rows, {0}) : Tensor();
                       return {gx, gw, gb};
                     },
                     autograd::Backward::differentiable);
  }
  return out;
}

Tensor Tensor::matmul(const Tensor& other) const { return ember::matmul(*this, other); }

}  // namespace ember
