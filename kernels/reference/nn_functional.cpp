#include "kernels/reference/nn_functional.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/reference/linalg.h"

namespace ember::reference {

RefTensor embedding(const RefTensor& weight, const RefTensor& indices) {
  const int64_t dim = weight.shape[1];
  Shape shape = indices.shape;
  shape.push_back(dim);
  RefTensor out(shape);
  for (int64_t j = 0; j < indices.numel(); ++j)
    for (int64_t k = 0; k < dim; ++k) out.data[size_t(j * dim + k)] = weight.at({int64_t(indices.data[size_t(j)]), k});
  return out;
}

RefTensor embedding_backward(const RefTensor& grad, const RefTensor& indices, int64_t num_embeddings,
                             int64_t padding_idx) {
  const int64_t dim = grad.shape.back();
  RefTensor out({num_embeddings, dim});
  for (int64_t j = 0; j < indices.numel(); ++j) {
    const int64_t row = int64_t(indices.data[size_t(j)]);
    if (row == padding_idx) continue;
    for (int64_t k = 0; k < dim; ++k) out.at({row, k}) += grad.data[size_t(j * dim + k)];
  }
  return out;
}

RefTensor dropout_mask(const Shape& shape, double p, GeneratorState state) {
  RefTensor mask(shape);
  for (int64_t i = 0; i < mask.numel(); ++i) {
    // every Philox block feeds four elements, one word each
    const auto words = Philox::draw(state.seed, 0, state.offset + uint64_t(i / 4));
    const double u = Philox::to_uniform(words[size_t(i % 4)]);
    mask.data[size_t(i)] = u >= p ? 1.0 : 0.0;
  }
  return mask;
}

RefTensor dropout(const RefTensor& x, double p, GeneratorState state) {
  RefTensor out = dropout_mask(x.shape, p, state);
  for (int64_t i = 0; i < out.numel(); ++i) out.data[size_t(i)] *= x.data[size_t(i)] / (1.0 - p);
  return out;
}

namespace {

// Logits as [N, C, D] and the matching target positions [N, D].
struct Layout {
  int64_t n, c, d;
  Layout(const RefTensor& logits) {
    n = logits.dim() == 1 ? 1 : logits.shape[0];
    c = logits.dim() == 1 ? logits.shape[0] : logits.shape[1];
    d = 1;
    for (int64_t k = 2; k < logits.dim(); ++k) d *= logits.shape[size_t(k)];
  }
  double x(const RefTensor& logits, int64_t pos, int64_t cls) const {
    return logits.data[size_t((pos / d) * c * d + cls * d + pos % d)];
  }
};

// log p[c] for all classes at one position.
std::vector<double> log_probs(const RefTensor& logits, const Layout& l, int64_t pos) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t k = 0; k < l.c; ++k) m = std::max(m, l.x(logits, pos, k));
  double s = 0;
  for (int64_t k = 0; k < l.c; ++k) s += std::exp(l.x(logits, pos, k) - m);
  std::vector<double> lp(size_t(l.c));
  for (int64_t k = 0; k < l.c; ++k) lp[size_t(k)] = l.x(logits, pos, k) - m - std::log(s);
  return lp;
}

int64_t count_targets(const RefTensor& target, int64_t ignore_index) {
  int64_t n = 0;
  for (double t : target.data) n += int64_t(t) != ignore_index;
  return n;
}

}  // namespace

RefTensor cross_entropy(const RefTensor& logits, const RefTensor& target, int64_t ignore_index,
                        double label_smoothing, Reduction reduction) {
  const Layout l(logits);
  RefTensor per(target.shape);
  for (int64_t pos = 0; pos < target.numel(); ++pos) {
    const int64_t t = int64_t(target.data[size_t(pos)]);
    if (t == ignore_index) continue;
    const std::vector<double> lp = log_probs(logits, l, pos);
    double mean_neg = 0;
    for (double v : lp) mean_neg -= v / double(l.c);
    per.data[size_t(pos)] = (1 - label_smoothing) * -lp[size_t(t)] + label_smoothing * mean_neg;
  }
  if (reduction == Reduction::None) return per;
  double total = 0;
  for (double v : per.data) total += v;
  RefTensor out(Shape{});
  out.data[0] = reduction == Reduction::Sum ? total : total / double(count_targets(target, ignore_index));
  return out;
}

RefTensor cross_entropy_backward(const RefTensor& logits, const RefTensor& target, const RefTensor& grad_loss,
                                 int64_t ignore_index, double label_smoothing, Reduction reduction) {
  const Layout l(logits);
  RefTensor grad(logits.shape);
  const int64_t count = count_targets(target, ignore_index);
  for (int64_t pos = 0; pos < target.numel(); ++pos) {
    const int64_t t = int64_t(target.data[size_t(pos)]);
    if (t == ignore_index) continue;
    const double g = reduction == Reduction::None ? grad_loss.data[size_t(pos)]
                     : reduction == Reduction::Sum ? grad_loss.data[0]
                                                   : grad_loss.data[0] / double(count);
    const std::vector<double> lp = log_probs(logits, l, pos);
    for (int64_t k = 0; k < l.c; ++k) {
      // d/dx_k of -log p_j is p_k - [k == j]; the smoothing term averages that over j.
      const double target_prob = (1 - label_smoothing) * (k == t ? 1.0 : 0.0) + label_smoothing / double(l.c);
      grad.data[size_t((pos / l.d) * l.c * l.d + k * l.d + pos % l.d)] = g * (std::exp(lp[size_t(k)]) - target_prob);
    }
  }
  return grad;
}

namespace {

// x [..., in] @ weight^T + bias as [rows, out].
RefTensor linear_rows(const RefTensor& x, const RefTensor& weight, const RefTensor& bias, bool has_bias) {
  RefTensor logits = linear(x, weight, bias, has_bias);
  logits.shape = {logits.numel() / weight.shape[0], weight.shape[0]};
  return logits;
}

RefTensor flat(const RefTensor& t) {
  RefTensor f = t;
  f.shape = {t.numel()};
  return f;
}

}  // namespace

LinearCrossEntropy linear_cross_entropy(const RefTensor& x, const RefTensor& weight, const RefTensor& bias,
                                        bool has_bias, const RefTensor& target, int64_t ignore_index,
                                        double label_smoothing, Reduction reduction) {
  LinearCrossEntropy r;
  r.logits = linear(x, weight, bias, has_bias);
  r.loss = cross_entropy(linear_rows(x, weight, bias, has_bias), flat(target), ignore_index, label_smoothing,
                         reduction);
  return r;
}

LinearCrossEntropyGrads linear_cross_entropy_backward(const RefTensor& x, const RefTensor& weight,
                                                      const RefTensor& bias, bool has_bias, const RefTensor& target,
                                                      const RefTensor& grad_loss, int64_t ignore_index,
                                                      double label_smoothing, Reduction reduction) {
  const int64_t out = weight.shape[0], in = weight.shape[1], rows = x.numel() / in;
  const RefTensor dlogits = cross_entropy_backward(linear_rows(x, weight, bias, has_bias), flat(target),
                                                   reduction == Reduction::None ? flat(grad_loss) : grad_loss,
                                                   ignore_index, label_smoothing, reduction);
  LinearCrossEntropyGrads g{RefTensor(x.shape), RefTensor(weight.shape), RefTensor(Shape{out})};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      const double d = dlogits.data[size_t(r * out + o)];
      g.dbias.data[size_t(o)] += d;
      for (int64_t i = 0; i < in; ++i) {
        g.dx.data[size_t(r * in + i)] += d * weight.data[size_t(o * in + i)];
        g.dweight.data[size_t(o * in + i)] += d * x.data[size_t(r * in + i)];
      }
    }
  return g;
}

}  // namespace ember::reference
