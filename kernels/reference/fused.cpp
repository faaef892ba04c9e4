#include "kernels/reference/fused.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/reference/elementwise.h"
#include "kernels/reference/normalization.h"

namespace ember::reference {

namespace {

// x * keep / (1 - p), or x without a mask.
RefTensor drop(const RefTensor& x, const RefTensor* keep, double p) {
  if (!keep) return x;
  RefTensor out = x;
  for (int64_t i = 0; i < out.numel(); ++i) out.data[size_t(i)] *= keep->data[size_t(i)] / (1.0 - p);
  return out;
}

// Sum over every dim but the last: [..., C] -> [C].
RefTensor column_sums(const RefTensor& x) {
  const int64_t c = x.shape.back();
  RefTensor out({c});
  for (int64_t i = 0; i < x.numel(); ++i) out.data[size_t(i % c)] += x.data[size_t(i)];
  return out;
}

// Sum over all but the trailing `ndim` dims: the shape of weight and bias.
RefTensor trailing_sums(const RefTensor& x, int64_t ndim) {
  RefTensor out(Shape(x.shape.end() - ndim, x.shape.end()));
  const int64_t n = out.numel();
  for (int64_t i = 0; i < x.numel(); ++i) out.data[size_t(i % n)] += x.data[size_t(i)];
  return out;
}

}  // namespace

// The erf form through erfc: x Phi(x) with Phi(x) = erfc(-x / sqrt2) / 2 keeps its relative
// accuracy far into the left tail, where 1 + erf(x / sqrt2) cancels to nothing.
double gelu_erfc(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }
double gelu_erfc_grad(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) * 0.39894228040143267794;  // 1 / sqrt(2 pi)
}

RefTensor bias_gelu(const RefTensor& x, const RefTensor& bias, bool tanh_approx) {
  const RefTensor v = add(x, bias);
  return tanh_approx ? gelu(v, true) : elementwise_map(v, gelu_erfc);
}

BiasGeluGrads bias_gelu_backward(const RefTensor& g, const RefTensor& x, const RefTensor& bias, bool tanh_approx) {
  BiasGeluGrads out;
  const RefTensor v = add(x, bias);
  out.dx = mul(g, tanh_approx ? unary_derivative("gelu_tanh", v) : elementwise_map(v, gelu_erfc_grad));
  out.dbias = column_sums(out.dx);
  return out;
}

RefTensor add_layer_norm(const RefTensor& x, const RefTensor& residual, int64_t normalized_ndim,
                         const RefTensor* weight, const RefTensor* bias, const RefTensor* x_bias, const RefTensor* keep,
                         double p, double eps) {
  const RefTensor biased = x_bias ? add(x, *x_bias) : x;
  return layer_norm(add(drop(biased, keep, p), residual), normalized_ndim, weight, bias, eps);
}

AddLayerNormGrads add_layer_norm_backward(const RefTensor& g, const RefTensor& x, const RefTensor& residual,
                                          int64_t normalized_ndim, const RefTensor* weight, const RefTensor* x_bias,
                                          const RefTensor* keep, double p, double eps) {
  const RefTensor biased = x_bias ? add(x, *x_bias) : x;
  const RefTensor h = add(drop(biased, keep, p), residual);
  const LayerNormGrads ln = layer_norm_backward(g, h, normalized_ndim, weight, eps);
  AddLayerNormGrads out;
  out.dresidual = ln.dx;
  out.dx = drop(ln.dx, keep, p);
  out.dweight = ln.dweight;
  out.dbias = ln.dbias;
  if (x_bias) out.dx_bias = trailing_sums(out.dx, normalized_ndim);
  return out;
}

RefTensor scaled_masked_softmax(const RefTensor& x, const RefTensor* mask, double scale, const RefTensor* keep,
                                double p) {
  RefTensor s = elementwise_map(x, [scale](double v) { return v * scale; });
  if (mask) s = add(s, *mask);
  return drop(softmax(s, x.dim() - 1), keep, p);
}

RefTensor scaled_masked_softmax_backward(const RefTensor& g, const RefTensor& x, const RefTensor* mask, double scale,
                                         const RefTensor* keep, double p) {
  RefTensor s = elementwise_map(x, [scale](double v) { return v * scale; });
  if (mask) s = add(s, *mask);
  const RefTensor y = softmax(s, x.dim() - 1);
  const RefTensor ds = softmax_backward(drop(g, keep, p), y, x.dim() - 1);
  return elementwise_map(ds, [scale](double v) { return v * scale; });
}

namespace {

// The probabilities P (before dropout) of every (batch, head) pair, [B, heads, L, L].
RefTensor attention_probs(const RefTensor& qkv, int64_t heads, const RefTensor* mask) {
  const int64_t b = qkv.shape[0], len = qkv.shape[1], e = qkv.shape[2] / 3, d = e / heads;
  const double scale = 1.0 / std::sqrt(double(d));
  const Shape shape{b, heads, len, len};
  RefTensor probs(shape);
  for (int64_t n = 0; n < b; ++n)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < len; ++i) {
        std::vector<double> s(static_cast<size_t>(len));
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < len; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += qkv.at({n, i, h * d + c}) * qkv.at({n, j, e + h * d + c});
          s[size_t(j)] = dot * scale + (mask ? mask->broadcast_at({n, h, i, j}, shape) : 0.0);
          m = std::max(m, s[size_t(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j < len; ++j) sum += std::exp(s[size_t(j)] - m);
        for (int64_t j = 0; j < len; ++j) probs.at({n, h, i, j}) = std::exp(s[size_t(j)] - m) / sum;
      }
  return probs;
}

}  // namespace

RefTensor packed_self_attention(const RefTensor& qkv, int64_t heads, const RefTensor* mask, const RefTensor* keep,
                                double p) {
  const int64_t b = qkv.shape[0], len = qkv.shape[1], e = qkv.shape[2] / 3, d = e / heads;
  const RefTensor probs = drop(attention_probs(qkv, heads, mask), keep, p);
  RefTensor out({b, len, e});
  for (int64_t n = 0; n < b; ++n)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < len; ++i)
        for (int64_t c = 0; c < d; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < len; ++j) acc += probs.at({n, h, i, j}) * qkv.at({n, j, 2 * e + h * d + c});
          out.at({n, i, h * d + c}) = acc;
        }
  return out;
}

RefTensor packed_self_attention_backward(const RefTensor& g, const RefTensor& qkv, int64_t heads, const RefTensor* mask,
                                         const RefTensor* keep, double p) {
  const int64_t b = qkv.shape[0], len = qkv.shape[1], e = qkv.shape[2] / 3, d = e / heads;
  const double scale = 1.0 / std::sqrt(double(d));
  const RefTensor probs = attention_probs(qkv, heads, mask);
  const RefTensor dropped = drop(probs, keep, p);
  RefTensor out(qkv.shape);
  for (int64_t n = 0; n < b; ++n)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t q0 = h * d, k0 = e + h * d, v0 = 2 * e + h * d;
      // dV[j] = sum_i P_drop[i, j] dO[i]
      for (int64_t j = 0; j < len; ++j)
        for (int64_t c = 0; c < d; ++c) {
          double acc = 0;
          for (int64_t i = 0; i < len; ++i) acc += dropped.at({n, h, i, j}) * g.at({n, i, h * d + c});
          out.at({n, j, v0 + c}) = acc;
        }
      // dS = P (dP - rowsum(dP P)) with dP = dropout_backward(dO V^T)
      std::vector<double> ds(static_cast<size_t>(len * len));
      for (int64_t i = 0; i < len; ++i) {
        std::vector<double> dp(static_cast<size_t>(len));
        double dot = 0;
        for (int64_t j = 0; j < len; ++j) {
          double acc = 0;
          for (int64_t c = 0; c < d; ++c) acc += g.at({n, i, h * d + c}) * qkv.at({n, j, v0 + c});
          dp[size_t(j)] = keep ? acc * keep->at({n, h, i, j}) / (1.0 - p) : acc;
          dot += dp[size_t(j)] * probs.at({n, h, i, j});
        }
        for (int64_t j = 0; j < len; ++j) ds[size_t(i * len + j)] = probs.at({n, h, i, j}) * (dp[size_t(j)] - dot);
      }
      // dQ = scale dS K, dK = scale dS^T Q
      for (int64_t i = 0; i < len; ++i)
        for (int64_t c = 0; c < d; ++c) {
          double aq = 0, ak = 0;
          for (int64_t j = 0; j < len; ++j) {
            aq += ds[size_t(i * len + j)] * qkv.at({n, j, k0 + c});
            ak += ds[size_t(j * len + i)] * qkv.at({n, j, q0 + c});
          }
          out.at({n, i, q0 + c}) = scale * aq;
          out.at({n, i, k0 + c}) = scale * ak;
        }
    }
  return out;
}

namespace {

// softmax(q k^T * scale + mask) of every pair, [n, L, S]; causal entries take no part.
RefTensor sdpa_probs(const RefTensor& q, const RefTensor& k, const RefTensor* mask, bool causal, double scale) {
  const int64_t n = q.shape[0], lq = q.shape[1], lk = k.shape[1], e = q.shape[2];
  const Shape shape{n, lq, lk};
  RefTensor probs(shape);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < lq; ++i) {
      std::vector<double> s(static_cast<size_t>(lk), -std::numeric_limits<double>::infinity());
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < lk; ++j) {
        if (causal && j > i) continue;
        double dot = 0;
        for (int64_t c = 0; c < e; ++c) dot += q.at({b, i, c}) * k.at({b, j, c});
        s[size_t(j)] = dot * scale + (mask ? mask->broadcast_at({b, i, j}, shape) : 0.0);
        m = std::max(m, s[size_t(j)]);
      }
      double sum = 0;
      for (int64_t j = 0; j < lk; ++j) sum += std::exp(s[size_t(j)] - m);
      for (int64_t j = 0; j < lk; ++j) probs.at({b, i, j}) = std::exp(s[size_t(j)] - m) / sum;
    }
  return probs;
}

// a [n, r, c1] times b [n, c1, c2] per pair (ta / tb: use a's / b's last two dims swapped).
RefTensor pair_product(const RefTensor& a, bool ta, const RefTensor& b, bool tb) {
  const int64_t n = a.shape[0];
  const int64_t rows = ta ? a.shape[2] : a.shape[1], inner = ta ? a.shape[1] : a.shape[2];
  const int64_t cols = tb ? b.shape[1] : b.shape[2];
  RefTensor out({n, rows, cols});
  for (int64_t p = 0; p < n; ++p)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        double acc = 0;
        for (int64_t x = 0; x < inner; ++x)
          acc += (ta ? a.at({p, x, i}) : a.at({p, i, x})) * (tb ? b.at({p, j, x}) : b.at({p, x, j}));
        out.at({p, i, j}) = acc;
      }
  return out;
}

}  // namespace

RefTensor scaled_dot_product_attention(const RefTensor& q, const RefTensor& k, const RefTensor& v, const RefTensor* mask,
                                       bool causal, double scale, const RefTensor* keep, double p) {
  return pair_product(drop(sdpa_probs(q, k, mask, causal, scale), keep, p), false, v, false);
}

AttentionGrads scaled_dot_product_attention_backward(const RefTensor& g, const RefTensor& q, const RefTensor& k,
                                                     const RefTensor& v, const RefTensor* mask, bool causal,
                                                     double scale, const RefTensor* keep, double p) {
  const RefTensor probs = sdpa_probs(q, k, mask, causal, scale);
  AttentionGrads out;
  out.dv = pair_product(drop(probs, keep, p), true, g, false);
  // dS = scale P (dP - rowsum(dP P)) with dP = dropout_backward(dO V^T)
  RefTensor ds = drop(pair_product(g, false, v, true), keep, p);
  const int64_t rows = probs.shape[0] * probs.shape[1], lk = probs.shape[2];
  for (int64_t r = 0; r < rows; ++r) {
    double dot = 0;
    for (int64_t j = 0; j < lk; ++j) dot += ds.data[size_t(r * lk + j)] * probs.data[size_t(r * lk + j)];
    for (int64_t j = 0; j < lk; ++j) {
      double& d = ds.data[size_t(r * lk + j)];
      d = probs.data[size_t(r * lk + j)] * (d - dot) * scale;
    }
  }
  out.dq = pair_product(ds, false, k, false);
  out.dk = pair_product(ds, true, q, false);
  return out;
}

}  // namespace ember::reference
