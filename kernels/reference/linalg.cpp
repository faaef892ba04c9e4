#include "kernels/reference/linalg.h"

namespace ember::reference {

RefTensor matmul(const RefTensor& a, const RefTensor& b) {
  // Promote vectors to matrices.
  RefTensor a2 = a, b2 = b;
  if (a.dim() == 1) a2.shape = {1, a.shape[0]};
  if (b.dim() == 1) b2.shape = {b.shape[0], 1};
  const int64_t n = a2.shape[a2.dim() - 2], k = a2.shape[a2.dim() - 1], m = b2.shape[b2.dim() - 1];

  const Shape batch_a(a2.shape.begin(), a2.shape.end() - 2), batch_b(b2.shape.begin(), b2.shape.end() - 2);
  const Shape batch = broadcast_shapes(batch_a, batch_b, "reference::matmul");
  Shape a_full = batch, b_full = batch, out_shape = batch;
  a_full.insert(a_full.end(), {n, k});
  b_full.insert(b_full.end(), {k, m});
  out_shape.insert(out_shape.end(), {n, m});

  RefTensor out(out_shape);
  for (int64_t flat = 0; flat < out.numel(); ++flat) {
    const Shape idx = unravel(flat, out_shape);
    const Shape bidx(idx.begin(), idx.end() - 2);
    const int64_t i = idx[idx.size() - 2], j = idx[idx.size() - 1];
    Shape ia = bidx, ib = bidx;
    ia.insert(ia.end(), {i, 0});
    ib.insert(ib.end(), {0, j});
    double acc = 0.0;
    for (int64_t p = 0; p < k; ++p) {
      ia.back() = p;
      ib[ib.size() - 2] = p;
      acc += a2.broadcast_at(ia, a_full) * b2.broadcast_at(ib, b_full);
    }
    out.data[size_t(flat)] = acc;
  }

  Shape result = batch;
  if (a.dim() > 1) result.push_back(n);
  if (b.dim() > 1) result.push_back(m);
  out.shape = result;
  return out;
}

RefTensor bmm(const RefTensor& a, const RefTensor& b) {
  const int64_t batches = a.shape[0], n = a.shape[1], k = a.shape[2], m = b.shape[2];
  RefTensor out({batches, n, m});
  for (int64_t s = 0; s < batches; ++s)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double acc = 0.0;
        for (int64_t p = 0; p < k; ++p) acc += a.at({s, i, p}) * b.at({s, p, j});
        out.at({s, i, j}) = acc;
      }
  return out;
}

RefTensor linear(const RefTensor& x, const RefTensor& weight, const RefTensor& bias, bool has_bias) {
  const int64_t in = weight.shape[1], out_features = weight.shape[0];
  Shape out_shape(x.shape.begin(), x.shape.end() - 1);
  const int64_t rows = numel_of(out_shape);
  out_shape.push_back(out_features);
  RefTensor out(out_shape);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out_features; ++o) {
      double acc = has_bias ? bias.data[size_t(o)] : 0.0;
      for (int64_t p = 0; p < in; ++p) acc += x.data[size_t(r * in + p)] * weight.data[size_t(o * in + p)];
      out.data[size_t(r * out_features + o)] = acc;
    }
  return out;
}

}  // namespace ember::reference
