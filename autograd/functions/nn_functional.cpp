// Differentiable embedding, dropout, cross-entropy and linear + cross-entropy. Forward work is in
// core/native/nn_functional.h; the backward formulas are fused kernels there as well.
#include "autograd/engine.h"
#include "autograd/functions/composed_gradient.h"
#include "autograd/functions/dropout_gradient.h"
#include "autograd/functions/softmax_gradients.h"
#include "autograd/node.h"
#include "core/autocast.h"
#include "core/factory.h"
#include "core/grad_mode.h"
#include "core/native/copy.h"
#include "core/native/indexing.h"
#include "core/native/nn_functional.h"
#include "core/ops.h"
#include "core/sparse_grad.h"

namespace ember {
using autograd::Tensors;

namespace autograd {

// Linear in g: its own gradient is the same formula.
Tensor dropout_grad(const Tensor& g, const Tensor& mask, double scale) {
  return linear_gradient("DropoutGradBackward", g, native::dropout_backward(g, mask, scale),
                         [mask, scale](const Tensor& h) { return dropout_grad(h, mask, scale); });
}

}  // namespace autograd

namespace {
Tensor embedding_lookup(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx, bool rows);

// The dense gradient of the table: the rows of g added at their indices (but the padding row's).
// It is linear in g; its own gradient looks h up at the same indices, zero at the padding row.
Tensor embedding_grad(const Tensor& g, const autograd::SavedTensor& indices, int64_t num, int64_t padding_row,
                      DType dtype) {
  return autograd::linear_gradient(
      "EmbeddingGradBackward", g,
      native::embedding_backward(native::to_dtype(g, dtype), indices.unpack(), num, padding_row),
      [indices, padding_row](const Tensor& h) {
        const Tensor index = indices.unpack();
        const Tensor rows = embedding_lookup(h, index, std::nullopt, false);
        return padding_row < 0 ? rows : masked_fill(rows, eq(index, double(padding_row)).unsqueeze(-1), 0.0);
      });
}

// rows: the backward leaves the table its rows (core/sparse_grad.h) instead of a dense table.
Tensor embedding_lookup(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx, bool rows) {
  Tensor out = native::embedding(weight, indices);
  const int64_t num = weight.size(0);
  const int64_t padding_row = native::embedding_padding_row(padding_idx, num);
  if (!autograd::needs_grad({weight})) return out;
  const autograd::SavedTensor saved_indices = autograd::save(indices);
  const DType dtype = weight.dtype();
  if (rows) {
    // backward(): the rows go straight to the table's row-sparse gradient (core/sparse_grad.h)
    // and nothing goes along the edge, so no dense table is built. autograd::grad returns
    // gradients instead of writing them: there the dense gradient goes along the edge, with
    // the same values, and under create_graph it is the differentiable one.
    std::shared_ptr<TensorImpl> table = weight.impl_ptr();
    autograd::record(
        "EmbeddingSparseBackward", {weight}, {out},
        [saved_indices, num, padding_row, dtype, table](const Tensors& g) -> Tensors {
          if (autograd::returning_gradients()) return {embedding_grad(g[0], saved_indices, num, padding_row, dtype)};
          Tensor(table).accumulate_sparse_grad(
              coalesce_rows(saved_indices.unpack(), native::to_dtype(g[0], dtype), num, padding_row));
          return {};
        },
        autograd::Backward::differentiable);
    return out;
  }
  autograd::record(
      "EmbeddingBackward", {weight}, {out},
      [saved_indices, num, padding_row, dtype](const Tensors& g) -> Tensors {
        return {embedding_grad(g[0], saved_indices, num, padding_row, dtype)};
      },
      autograd::Backward::differentiable);
  return out;
}
}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx) {
  return embedding_lookup(weight, indices, padding_idx, weight.is_leaf() && weight.row_sparse_grad());
}

Tensor embedding_with_row_sparse_backward(const Tensor& weight, const Tensor& indices,
                                          std::optional<int64_t> padding_idx) {
  EMBER_CHECK(weight.is_leaf() && weight.dim() == 2, "embedding_with_row_sparse_backward: the table must be a 2-D "
              "leaf; got a ", weight.is_leaf() ? "leaf" : "non-leaf", " of shape ", weight.shape());
  return embedding_lookup(weight, indices, padding_idx, true);
}

Tensor dropout(const Tensor& x, double p, bool training) {
  native::check_dropout_probability(p);
  if (!training || p == 0.0) return x;
  EMBER_CHECK(x.is_floating_point(), "dropout: expected a floating-point tensor, got ", dtype_name(x.dtype()),
              " of shape ", x.shape());
  if (p == 1.0) {
    // Everything dropped: no random numbers needed, and no gradient gets through.
    Tensor out = zeros(x.shape(), {x.dtype(), x.device()});
    if (autograd::needs_grad({x})) {
      // a constant: its own gradient is zero
      autograd::record(
          "DropoutBackward", {x}, {out},
          [](const Tensors& g) -> Tensors { return {zeros(g[0].shape(), {g[0].dtype(), g[0].device()})}; },
          autograd::Backward::differentiable);
    }
    return out;
  }
  native::DropoutResult r = native::dropout(x, p);
  if (autograd::needs_grad({x})) {
    const double scale = 1.0 / (1.0 - p);
    const Tensor mask = r.mask;
    autograd::record(
        "DropoutBackward", {x}, {r.out},
        [mask, scale](const Tensors& g) -> Tensors { return {autograd::dropout_grad(g[0], mask, scale)}; },
        autograd::Backward::differentiable);
  }
  return r.out;
}

Tensor cross_entropy(const Tensor& logits_in, const Tensor& target, int64_t ignore_index, double label_smoothing,
                     Reduction reduction) {
  // Under autocast, half logits are read as they are (the kernel computes in f32) and the loss
  // comes back in f32: the f32 policy without a converted copy of a [tokens, vocab] tensor.
  const Tensor& logits = logits_in;
  native::CrossEntropyArgs args{ignore_index, label_smoothing, reduction};
  args.accumulate_type_loss = autocast::active_for(logits) && logits.is_floating_point() && logits.dtype() != DType::f64;
  native::CrossEntropyResult r = native::cross_entropy(logits, target, args);
  if (!autograd::needs_grad({logits})) return r.loss;
  // Keep the row statistics, not the loss itself (the loss holds this node: no cycles).
  native::CrossEntropyResult stats;
  stats.lse = r.lse.detach();  // the forward's own buffer: nothing else can write into it
  stats.count = r.count;
  const autograd::SavedTensor saved_logits = autograd::save(r.logits), saved_target = autograd::save(r.target);
  // The logits themselves too (the same storage when contiguous): a second derivative reads
  // their history.
  autograd::record(
      "CrossEntropyBackward", {logits}, {r.loss},
      [stats, saved_logits, saved_target, input = autograd::save_with_history(logits),
       args](const Tensors& g) -> Tensors {
        native::CrossEntropyResult saved = stats;
        saved.logits = saved_logits.unpack();
        saved.target = saved_target.unpack();
        return {autograd::cross_entropy_grad(g[0], input.unpack(), saved, args)};
      },
      autograd::Backward::differentiable);
  return r.loss;
}

namespace {

// The logits as a function of x, weight and bias, for linear_cross_entropy's composed gradients:
// linear recomputed from them with their history; when x and weight were not kept (only the bias
// gets a gradient, they are constants) the saved logits with the bias's history alone.
Tensor linear_logits_with_history(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                  const Tensor& saved_logits, int64_t rows, int64_t out_features) {
  if (x.defined()) return linear(x, weight, bias).reshape({rows, out_features});
  const Tensor logits = saved_logits.reshape({rows, out_features});
  if (!bias.defined()) return logits;
  return autograd::with_history_of("LinearCrossEntropyLogitsBackward", logits, bias.expand({rows, out_features}));
}

struct WantedGradients {
  bool x, weight, bias;
};

// The gradients of x, weight and bias from the logits' [rows, out] gradient, by differentiable ops.
Tensors linear_cross_entropy_gradients(const Tensor& grad_logits, const Tensor& x, const Tensor& weight,
                                       const Shape& x_shape, WantedGradients want) {
  const int64_t rows = grad_logits.size(0);
  return {want.x ? matmul(grad_logits, weight).reshape(x_shape) : Tensor(),
          want.weight ? matmul(grad_logits.transpose(0, 1), x.reshape({rows, weight.size(1)})) : Tensor(),
          want.bias ? sum(grad_logits, {0}) : Tensor()};
}

}  // namespace

std::pair<Tensor, Tensor> linear_cross_entropy(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in,
                                               const Tensor& target, int64_t ignore_index, double label_smoothing,
                                               Reduction reduction) {
  // Lowered once (leaf weights come from autocast's cache) and shared by both nodes below.
  const Tensor x = autocast::to_lower(x_in), weight = autocast::to_lower(weight_in), bias = autocast::to_lower(bias_in);
  // Differentiable: a gradient reaching the logits themselves flows through linear's own node.
  Tensor logits = linear(x, weight, bias);
  const int64_t out_features = weight.size(0), in = weight.size(1);
  const int64_t rows = out_features == 0 ? 0 : logits.numel() / out_features;
  EMBER_CHECK(target.numel() == rows, "linear_cross_entropy: target of shape ", target.shape(), " has ",
              target.numel(), " class indices for the ", rows, " rows of x of shape ", x_in.shape());
  const Tensor rows_logits = logits.reshape({rows, out_features}), rows_target = target.reshape({rows});
  if (!logits.device().is_cpu())
    return {logits, cross_entropy(rows_logits, rows_target, ignore_index, label_smoothing, reduction)};

  native::CrossEntropyArgs args{ignore_index, label_smoothing, reduction};
  args.accumulate_type_loss = autocast::active_for(logits) && logits.dtype() != DType::f64;
  const native::CrossEntropyResult r = native::cross_entropy(rows_logits.detach(), rows_target, args);
  if (!autograd::needs_grad({x, weight, bias})) return {logits, r.loss};

  const bool want_x = x.requires_grad(), want_w = weight.requires_grad();
  const bool want_bias = bias.defined() && bias.requires_grad();
  native::CrossEntropyResult stats;
  stats.lse = r.lse.detach();
  stats.count = r.count;
  // The first-order formula reads the weight for x's gradient and x for the weight's. The
  // composed one (under create_graph) recomputes the logits from x, weight and bias with their
  // history, so the node keeps both whenever either gets a gradient (x is usually alive anyway,
  // the weight always); a gradient for the bias alone needs neither.
  const bool keep_x_and_weight = want_x || want_w;
  // The loss's own node: from the loss straight to x, weight and bias, without the logits.
  autograd::record(
      "LinearCrossEntropyBackward", {x, weight, bias}, {r.loss},
      [stats, saved_logits = autograd::save(r.logits), saved_target = autograd::save(r.target),
       sx = autograd::save_with_history(keep_x_and_weight ? x : Tensor()),
       sw = autograd::save_with_history(keep_x_and_weight ? weight : Tensor()), sb = autograd::save_with_history(bias),
       bias_dtype = bias.defined() ? bias.dtype() : DType::f32, x_shape = x.shape(), rows, in, out_features, args,
       want_x, want_w, want_bias](const Tensors& g) -> Tensors {
        native::CrossEntropyResult saved = stats;
        saved.logits = saved_logits.unpack();
        saved.target = saved_target.unpack();
        // Under create_graph (grad mode) the composed formula reads x, weight and bias with their
        // history. An ordinary backward unpacks, and so checks for in-place changes, only what
        // the fused values below read (without history).
        const bool composing = GradMode::is_enabled();
        const Tensor xh = want_w || composing ? sx.unpack() : Tensor(),
                     wh = want_x || composing ? sw.unpack() : Tensor(), bh = composing ? sb.unpack() : Tensor();
        const Tensor xv = xh.defined() ? xh.detach() : xh, wv = wh.defined() ? wh.detach() : wh;
        // Ignored rows have a zero gradient. When they are most rows (masked-LM losses score
        // about 15%), both products run over the scored rows only: the gradient of x is zero
        // elsewhere, and the weight gradient's zero terms are dropped.
        Tensor scored = native::scored_rows(saved, args.ignore_index);
        if (scored.numel() * 2 > rows) scored = Tensor();
        Tensor grad_logits, gb;
        if (want_bias || scored.defined()) {
          native::LinearCrossEntropyGrads grads = native::linear_cross_entropy_backward(g[0], saved, args, scored);
          grad_logits = grads.grad_logits;
          if (want_bias) gb = native::to_dtype(grads.grad_bias, bias_dtype);
        } else {
          grad_logits = native::cross_entropy_backward(g[0], saved, {rows, out_features}, args);
        }
        Tensor gx, gw;
        if (scored.defined()) {
          if (want_x)
            gx = native::index_add(zeros({rows, in}, {wv.dtype(), wv.device()}), 0, scored, matmul(grad_logits, wv))
                     .reshape(x_shape);
          if (want_w)
            gw = matmul(grad_logits.transpose(0, 1), native::index_select(xv.reshape({rows, in}), 0, scored));
        } else {
          if (want_x) gx = matmul(grad_logits, wv).reshape(x_shape);
          if (want_w) gw = matmul(grad_logits.transpose(0, 1), xv.reshape({rows, in}));
        }
        return autograd::with_composed_history("LinearCrossEntropyGradBackward", {gx, gw, gb}, {g[0], xh, wh, bh},
                                               [&] {
                                                 const Tensor logits_h = linear_logits_with_history(
                                                     xh, wh, bh, saved.logits, rows, out_features);
                                                 return linear_cross_entropy_gradients(
                                                     autograd::cross_entropy_grad(g[0], logits_h, saved, args), xh, wh,
                                                     x_shape, {want_x, want_w, want_bias});
                                               });
      },
      autograd::Backward::differentiable);
  return {logits, r.loss};
}

}  // namespace ember
