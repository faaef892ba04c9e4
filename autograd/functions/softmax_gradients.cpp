// Backward of the softmax-family gradients. With h the gradient of the op's result:
//   softmax_grad      d/dg = softmax_grad(h, y)          d/dy = h (g - sum(g y)) - g sum(h y)
//   log_softmax_grad  d/dg = h - sum(h exp(y))           d/dy = -h exp(y) sum(g)
//   cross_entropy     d/dgrad_loss = the rows' sum(h q)  d/dlogits = softmax_grad(h w, softmax(logits))
// (sums along the softmax dim; q and w as in softmax_gradients.h).
#include "autograd/functions/softmax_gradients.h"

#include <algorithm>

#include "autograd/node.h"
#include "core/native/elementwise.h"
#include "core/native/normalization.h"
#include "core/ops.h"
#include "core/shape.h"

namespace ember::autograd {
namespace {

// Sum along dim, kept as a size-1 dim; a 0-d tensor is its own one-element line.
Tensor line_sum(const Tensor& t, int64_t dim) {
  if (t.dim() == 0) return t;
  return sum(t, {normalize_dim(dim, t.dim(), "softmax backward")}, /*keepdim=*/true);
}

// onehot(target) [n, c, d] in dtype, with ignored rows' targets (possibly out of range) read as 0.
Tensor one_hot_classes(const Tensor& target, int64_t ignore_index, int64_t c, DType dtype) {
  const Tensor safe = native::masked_fill(target, eq(target, double(ignore_index)), 0.0);
  return one_hot(safe, c).permute({0, 2, 1}).to(dtype);
}

// dx = f(g, y), the native value, recorded as `name` when g or y needs grad: with h the gradient
// of dx, g's gradient is grad_g(h, y) and y's is grad_y(h, g, y), both differentiable.
template <class GradG, class GradY>
Tensor with_backward(const char* name, const Tensor& g, const Tensor& y, Tensor dx, GradG grad_g, GradY grad_y) {
  if (!needs_grad({g, y})) return dx;
  const bool want_g = g.requires_grad(), want_y = y.requires_grad();
  record(
      name, {g, y}, {dx},
      [grad_g, grad_y, want_g, want_y, g_dtype = g.dtype(), sg = save_with_history(want_y ? g : Tensor()),
       sy = save_with_history(y)](const Tensors& h) -> Tensors {
        const Tensor yv = sy.unpack();
        return {want_g ? grad_g(h[0], yv).to(g_dtype) : Tensor(),
                want_y ? grad_y(h[0], sg.unpack(), yv).to(yv.dtype()) : Tensor()};
      },
      Backward::differentiable);
  return dx;
}

}  // namespace

Tensor softmax_grad(const Tensor& g, const Tensor& y, int64_t dim) {
  return with_backward(
      "SoftmaxBackwardBackward", g, y, native::softmax_backward(g, y, dim),
      [dim](const Tensor& h, const Tensor& yv) { return softmax_grad(h, yv, dim); },
      [dim](const Tensor& h, const Tensor& gv, const Tensor& yv) {
        return sub(mul(h, sub(gv, line_sum(mul(gv, yv), dim))), mul(gv, line_sum(mul(h, yv), dim)));
      });
}

Tensor log_softmax_grad(const Tensor& g, const Tensor& y, int64_t dim) {
  return with_backward(
      "LogSoftmaxBackwardBackward", g, y, native::log_softmax_backward(g, y, dim),
      [dim](const Tensor& h, const Tensor& yv) { return sub(h, line_sum(mul(h, exp(yv)), dim)); },
      [dim](const Tensor& h, const Tensor& gv, const Tensor& yv) {
        return neg(mul(mul(h, exp(yv)), line_sum(gv, dim)));
      });
}

Tensor cross_entropy_grad(const Tensor& grad_loss, const Tensor& logits, const native::CrossEntropyResult& saved,
                          const native::CrossEntropyArgs& args) {
  Tensor dlogits = native::cross_entropy_backward(grad_loss, saved, logits.shape(), args);
  if (!needs_grad({grad_loss, logits})) return dlogits;
  const bool want_g = grad_loss.requires_grad(), want_x = logits.requires_grad();
  const Shape canonical = saved.logits.shape();  // [n, c, d]
  record(
      "CrossEntropyBackwardBackward", {grad_loss, logits}, {dlogits},
      [args, canonical, want_g, want_x, loss_shape = grad_loss.shape(), g_dtype = grad_loss.dtype(),
       count = saved.count, st = save(saved.target), sg = save_with_history(want_x ? grad_loss : Tensor()),
       sx = save_with_history(logits)](const Tensors& h) -> Tensors {
        const int64_t n = canonical[0], c = canonical[1], d = canonical[2];
        if (n * c * d == 0) return {Tensor(), Tensor()};
        const Tensor x = sx.unpack(), target = st.unpack();
        const Tensor p = softmax(x.reshape(canonical), 1);
        const Tensor h3 = h[0].reshape(canonical);
        // ignored rows have no loss and a zero gradient
        const Tensor scored = ne(target, double(args.ignore_index)).to(x.dtype()).reshape({n, 1, d});
        const bool mean = args.reduction == Reduction::Mean;
        const double per_row = mean ? 1.0 / double(std::max<int64_t>(count, 1)) : 1.0;
        Tensor dg, dx;
        if (want_g) {
          const double eps = args.label_smoothing;
          Tensor q = p;  // the gradient of each row's loss in its logits
          if (eps < 1.0) q = sub(q, mul(one_hot_classes(target, args.ignore_index, c, x.dtype()), 1.0 - eps));
          if (eps > 0.0) q = sub(q, eps / double(c));
          const Tensor rows = mul(sum(mul(h3, q), {1}, /*keepdim=*/true), scored);
          dg = args.reduction == Reduction::None ? rows : mul(sum(rows), per_row);
          dg = dg.reshape(loss_shape).to(g_dtype);
        }
        if (want_x) {
          const Tensor gl = sg.unpack();
          const Tensor w =
              args.reduction == Reduction::None ? gl.reshape({n, 1, d}) : mul(gl.reshape({1, 1, 1}), per_row);
          dx = softmax_grad(mul(h3, mul(w, scored)), p, 1).reshape(x.shape()).to(x.dtype());
        }
        return {dg, dx};
      },
      Backward::differentiable);
  return dlogits;
}

}  // namespace ember::autograd
