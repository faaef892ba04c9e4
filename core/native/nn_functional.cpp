#include "core/native/nn_functional.h"

#include <algorithm>
#include <vector>

#include "core/factory.h"
#include "core/native/copy.h"
#include "core/native/views.h"

namespace ember::native {

EMBER_DEFINE_STUB(embedding_stub);
EMBER_DEFINE_STUB(embedding_backward_stub);
EMBER_DEFINE_STUB(dropout_stub);
EMBER_DEFINE_STUB(dropout_backward_stub);
EMBER_DEFINE_STUB(cross_entropy_stub);
EMBER_DEFINE_STUB(cross_entropy_backward_stub);
EMBER_DEFINE_STUB(linear_cross_entropy_backward_stub);

// ---- embedding

namespace {
void check_embedding_args(const Tensor& weight, const Tensor& indices) {
  EMBER_CHECK(weight.dim() == 2, "embedding: weight must be 2-D [num_embeddings, embedding_dim], got shape ",
              weight.shape());
  EMBER_CHECK(indices.dtype() == DType::i64 || indices.dtype() == DType::i32,
              "embedding: indices must be an integer tensor (int64 or int32), got ", dtype_name(indices.dtype()),
              " of shape ", indices.shape());
  EMBER_CHECK(indices.device() == weight.device(), "embedding: indices are on ", indices.device(),
              " but the weight is on ", weight.device());
}
}  // namespace

int64_t embedding_padding_row(std::optional<int64_t> padding_idx, int64_t num_embeddings) {
  if (!padding_idx) return -1;
  const int64_t p = *padding_idx;
  EMBER_CHECK(p >= -num_embeddings && p < num_embeddings, "embedding: padding_idx ", p,
              " is out of range for ", num_embeddings, " embeddings (valid range [", -num_embeddings, ", ",
              num_embeddings, "))");
  return p < 0 ? p + num_embeddings : p;
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  check_embedding_args(weight, indices);
  Shape out_shape = indices.shape();
  out_shape.push_back(weight.size(1));
  Tensor out = make_tensor(out_shape, weight.dtype(), weight.device());
  embedding_stub.call(weight.device(), "embedding")(out, contiguous(weight), contiguous(reshape(indices, {-1})));
  return out;
}

Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_embeddings, int64_t padding_row) {
  EMBER_CHECK(grad.dim() == indices.dim() + 1 &&
                  Shape(grad.shape().begin(), grad.shape().end() - 1) == indices.shape(),
              "embedding_backward: gradient of shape ", grad.shape(), " does not match indices of shape ",
              indices.shape());
  const int64_t dim = grad.size(-1);
  Tensor grad_weight = zeros({num_embeddings, dim}, {grad.dtype(), grad.device()});
  if (grad.numel() > 0) {
    embedding_backward_stub.call(grad.device(), "embedding_backward")(
        grad_weight, contiguous(reshape(grad, {-1, dim})), contiguous(reshape(indices, {-1})), padding_row);
  }
  return grad_weight;
}

// ---- dropout

void check_dropout_probability(double p) {
  EMBER_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability p must be in [0, 1], got ", p);
}

DropoutResult dropout(const Tensor& x, double p, Generator& gen) {
  check_dropout_probability(p);
  EMBER_CHECK(p < 1.0, "dropout: p = 1 drops everything; it draws no random numbers");
  EMBER_CHECK(x.is_floating_point(), "dropout: expected a floating-point tensor, got ", dtype_name(x.dtype()),
              " of shape ", x.shape());
  DropoutResult r{make_tensor(x.shape(), x.dtype(), x.device()), make_tensor(x.shape(), DType::boolean, x.device())};
  if (x.numel() == 0) return r;
  const GeneratorState st = gen.reserve(uint64_t(x.numel()));
  dropout_stub.call(x.device(), "dropout")(r.out, r.mask, contiguous(x), p, 1.0 / (1.0 - p), st);
  return r;
}

Tensor dropout_backward(const Tensor& grad, const Tensor& mask, double scale) {
  EMBER_CHECK(grad.shape() == mask.shape(), "dropout_backward: gradient of shape ", grad.shape(),
              " does not match mask of shape ", mask.shape());
  Tensor out = make_tensor(grad.shape(), grad.dtype(), grad.device());
  if (grad.numel() > 0)
    dropout_backward_stub.call(grad.device(), "dropout_backward")(out, contiguous(grad), contiguous(mask), scale);
  return out;
}

// ---- cross entropy

CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyArgs& args) {
  EMBER_CHECK(logits.is_floating_point(), "cross_entropy: logits must be floating point, got ",
              dtype_name(logits.dtype()), " of shape ", logits.shape());
  EMBER_CHECK(target.dtype() == DType::i64 || target.dtype() == DType::i32,
              "cross_entropy: target must hold class indices (int64), got ", dtype_name(target.dtype()),
              " of shape ", target.shape(), "; probability targets are not supported");
  EMBER_CHECK(target.device() == logits.device(), "cross_entropy: target is on ", target.device(),
              " but the logits are on ", logits.device());
  EMBER_CHECK(args.label_smoothing >= 0.0 && args.label_smoothing <= 1.0,
              "cross_entropy: label_smoothing must be in [0, 1], got ", args.label_smoothing);
  EMBER_CHECK(logits.dim() >= 1, "cross_entropy: logits must be [N, C] or [N, C, d1, ...], got shape ",
              logits.shape());
  // Canonical layout: logits [N, C, D], target [N, D]; unbatched [C] is N = 1.
  const bool unbatched = logits.dim() == 1;
  Shape want_target;
  int64_t n = 1, c = 0, d = 1;
  if (unbatched) {
    c = logits.size(0);
  } else {
    n = logits.size(0);
    c = logits.size(1);
    want_target.push_back(n);
    for (int64_t k = 2; k < logits.dim(); ++k) {
      want_target.push_back(logits.size(k));
      d *= logits.size(k);
    }
  }
  EMBER_CHECK(target.shape() == want_target, "cross_entropy: target of shape ", target.shape(),
              " does not match logits of shape ", logits.shape(), " (expected target shape ", want_target, ")");
  EMBER_CHECK(c > 0 || n * d == 0, "cross_entropy: logits of shape ", logits.shape(), " have no classes");

  CrossEntropyResult r;
  r.logits = contiguous(reshape(logits, {n, c, d}));
  r.target = contiguous(reshape(target, {n, d}));
  const DType acc = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  r.lse = make_tensor({n, d}, acc, logits.device());
  r.loss = make_tensor(args.reduction == Reduction::None ? target.shape() : Shape{},
                       args.accumulate_type_loss ? acc : logits.dtype(), logits.device());
  r.count = cross_entropy_stub.call(logits.device(), "cross_entropy")(r.loss, r.lse, r.logits, r.target, args);
  return r;
}

Tensor cross_entropy_backward(const Tensor& grad_loss, const CrossEntropyResult& saved, const Shape& logits_shape,
                              const CrossEntropyArgs& args) {
  Tensor grad = make_tensor(saved.logits.shape(), saved.logits.dtype(), saved.logits.device());
  if (grad.numel() > 0) {
    Tensor g = contiguous(to_dtype(reshape(grad_loss, {-1}), saved.lse.dtype()));
    cross_entropy_backward_stub.call(grad.device(), "cross_entropy_backward")(grad, g, saved.logits, saved.target,
                                                                              saved.lse, args, saved.count);
  }
  return reshape(grad, logits_shape);
}

LinearCrossEntropyGrads linear_cross_entropy_backward(const Tensor& grad_loss, const CrossEntropyResult& saved,
                                                      const CrossEntropyArgs& args, const Tensor& scored_rows) {
  const Tensor& logits = saved.logits;
  EMBER_CHECK(logits.dim() == 3 && logits.size(2) == 1,
              "linear_cross_entropy_backward: expected logits saved as [N, C, 1], got shape ", logits.shape());
  const int64_t n = logits.size(0), c = logits.size(1);
  EMBER_CHECK(!scored_rows.defined() || (scored_rows.dtype() == DType::i64 && scored_rows.dim() == 1 &&
                                         scored_rows.is_contiguous() && scored_rows.numel() <= n),
              "linear_cross_entropy_backward: scored rows must be a contiguous int64 vector of at most ", n,
              " rows, got shape ", scored_rows.shape());
  LinearCrossEntropyGrads grads;
  grads.grad_logits = make_tensor({scored_rows.defined() ? scored_rows.numel() : n, c}, logits.dtype(),
                                  logits.device());
  grads.grad_bias = make_tensor({c}, saved.lse.dtype(), logits.device());
  if (n == 0) {
    fill_(grads.grad_bias, 0.0);
    return grads;
  }
  const Tensor g = contiguous(to_dtype(reshape(grad_loss, {-1}), saved.lse.dtype()));
  linear_cross_entropy_backward_stub.call(logits.device(), "linear_cross_entropy_backward")(
      grads.grad_logits, grads.grad_bias, g, logits, saved.target, saved.lse, scored_rows, args, saved.count);
  return grads;
}

Tensor scored_rows(const CrossEntropyResult& saved, int64_t ignore_index) {
  const Tensor target = contiguous(to_dtype(reshape(saved.target, {-1}), DType::i64));
  EMBER_CHECK(target.device().is_cpu(), "scored_rows: expected a target on the CPU, got ", target.device());
  const int64_t* t = target.data_ptr<int64_t>();
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < target.numel(); ++r)
    if (t[r] != ignore_index) rows.push_back(r);
  Tensor out = make_tensor({int64_t(rows.size())}, DType::i64, target.device());
  if (!rows.empty()) std::copy(rows.begin(), rows.end(), out.data_ptr<int64_t>());
  return out;
}

}  // namespace ember::native
