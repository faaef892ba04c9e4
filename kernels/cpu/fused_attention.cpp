// CPU multi-head self-attention on one packed projection, forward and backward
// (core/native/fused.h).
//
// Work is split by (batch, head) pairs. Each pair reads its q, k and v columns of qkv in place
// (row stride 3E: the GEMMs take strided operands) and keeps its L x L scores in a per-thread
// buffer: S = q k^T, the scaled and masked softmax and dropout of each row (the row code of
// kernels/cpu/fused_softmax_rows.h and the mask stream of kernels/cpu/dropout_mask.h, as
// scaled_masked_softmax uses), then ctx = P v written straight into the head's columns of the
// [B, L, E] output. Nothing of size L x L reaches memory but the dropout's keep mask.
//
// Backward, per pair: S and P are recomputed bit for bit from q, k, the mask and the saved row
// statistics, then
//   dV = P_drop^T dO,  dP = dropout_backward(dO V^T),  dS = P (dP - rowsum(dP P)),
//   dQ = scale dS K,   dK = scale dS^T Q  (the scale applied to dS, not in the GEMMs),
// each written into its columns of dqkv. bf16 runs the products as bf16 GEMMs accumulating in
// f32 (scores in f32), with the softmax in float; f64 runs in double throughout.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/native/fused.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/dropout_mask.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/fused_softmax_rows.h"
#include "kernels/cpu/vec_half.h"

namespace ember {
namespace {

using native::FusedDropout;

// The geometry of one (batch, head) pair inside qkv [B, L, 3E] and ctx [B, L, E].
struct Heads {
  int64_t batch, heads, len, e, d;
  int64_t pairs() const { return batch * heads; }
  // Offsets (in elements) of the pair's q columns in qkv and of its columns in ctx.
  int64_t q_offset(int64_t pair) const { return (pair / heads) * len * 3 * e + (pair % heads) * d; }
  int64_t ctx_offset(int64_t pair) const { return (pair / heads) * len * e + (pair % heads) * d; }
};

Heads heads_of(const Tensor& qkv, int64_t heads) {
  const int64_t e = qkv.size(2) / 3;
  return {qkv.size(0), heads, qkv.size(1), e, e / heads};
}

// C = alpha op(A) op(B) through cpu::gemm (gemm.h's layout conventions). C is T, or float for
// bf16 operands (bf16 products accumulate in f32 either way).
template <typename T, typename C>
void product(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const T* a, int64_t lda, const T* b,
             int64_t ldb, C* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    cpu::gemm(ta, tb, m, n, k, float(alpha), a, lda, b, ldb, 0.0f, c, ldc);
  } else {
    static_assert(std::is_same_v<T, C>);
    cpu::gemm<T>(ta, tb, m, n, k, T(alpha), a, lda, b, ldb, T(0), c, ldc);
  }
}

// ---- f32 / bf16: T is the data type, scores and probabilities are float

// The probabilities of the rows of pair `pair` into s (holding the unscaled scores q k^T on entry),
// from the saved (or, with compute_stats, newly computed) row statistics.
void softmax_rows(float* s, int64_t pair, const Heads& h, float scale, const cpu::MaskRows<float>& masks,
                  float* mask_buf, float* stats, bool compute_stats) {
  const int64_t len = h.len;
  for (int64_t i = 0; i < len; ++i) {
    float* row = s + i * len;
    const int64_t r = pair * len + i;
    const float* mr = masks.defined() ? masks.row(r, len, mask_buf) : nullptr;
    cpu::scores_row(row, row, mr, scale, len);
    if (compute_stats) {
      const float m = cpu::row_max(row, len);
      const float inv = float(1.0 / cpu::exp_row(row, len, m));
      stats[2 * r] = m;
      stats[2 * r + 1] = inv;
    } else {
      cpu::exp_row(row, len, stats[2 * r]);
    }
    cpu::scale_row(row, len, stats[2 * r + 1]);
  }
}

// Rows of float values as T (a copy for bf16; float data is used in place).
template <typename T>
const T* as_operand(const float* src, int64_t n, T* buf) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    cpu::vec8::convert_row(buf, src, n);
    return buf;
  }
}

template <typename T>
void forward_float(const Tensor& ctx, const Tensor& stats, const Tensor& keep, const Tensor& qkv, const Tensor& mask,
                   int64_t heads, double scale, const FusedDropout& d) {
  const Heads h = heads_of(qkv, heads);
  const int64_t len = h.len, ld = 3 * h.e;
  const T* x = qkv.data_ptr<T>();
  T* out = ctx.data_ptr<T>();
  float* st = stats.data_ptr<float>();
  uint8_t* kp = keep.defined() ? reinterpret_cast<uint8_t*>(keep.data_ptr<bool>()) : nullptr;
  const uint32_t threshold = d.active() ? cpu::dropout_threshold(d.p) : 0;
  const cpu::MaskRows<float> masks(mask, {h.batch, heads, len, len});
  parallel_for(0, h.pairs(), 1, [&](int64_t p0, int64_t p1) {
    const size_t square = static_cast<size_t>(len * len);
    float* s = cpu::thread_scratch<float>(0, square);
    float* mask_buf = cpu::thread_scratch<float>(1, static_cast<size_t>(len));
    T* p_buf = cpu::thread_scratch<T>(2, std::is_same_v<T, float> ? 0 : square);
    for (int64_t pair = p0; pair < p1; ++pair) {
      const T* q = x + h.q_offset(pair);
      product(false, true, len, len, h.d, 1.0, q, ld, q + h.e, ld, s, len);
      softmax_rows(s, pair, h, float(scale), masks, mask_buf, st, true);
      if (kp) {
        uint8_t* kr = kp + pair * len * len;
        cpu::dropout_keep_mask(d.state, threshold, pair * len * len, len * len, kr);
        cpu::apply_keep_mask(s, s, kr, float(d.scale), len * len);
      }
      const T* probs = as_operand(s, len * len, p_buf);
      product(false, false, len, h.d, len, 1.0, probs, len, q + 2 * h.e, ld, out + h.ctx_offset(pair), h.e);
    }
  });
}

template <typename T>
void backward_float(const Tensor& dqkv, const Tensor& grad, const Tensor& qkv, const Tensor& mask, const Tensor& stats,
                    const Tensor& keep, int64_t heads, double scale, double dropout_scale) {
  const Heads h = heads_of(qkv, heads);
  const int64_t len = h.len, ld = 3 * h.e;
  const T* x = qkv.data_ptr<T>();
  const T* g = grad.data_ptr<T>();
  T* dx = dqkv.data_ptr<T>();
  float* st = stats.data_ptr<float>();
  const uint8_t* kp = keep.defined() ? reinterpret_cast<const uint8_t*>(keep.data_ptr<bool>()) : nullptr;
  const cpu::MaskRows<float> masks(mask, {h.batch, heads, len, len});
  const float ds = float(dropout_scale), sc = float(scale);
  parallel_for(0, h.pairs(), 1, [&](int64_t p0, int64_t p1) {
    const size_t square = static_cast<size_t>(len * len);
    float* p = cpu::thread_scratch<float>(0, square);
    float* pd = cpu::thread_scratch<float>(1, kp ? square : 0);
    float* dp = cpu::thread_scratch<float>(2, square);
    float* mask_buf = cpu::thread_scratch<float>(3, static_cast<size_t>(len));
    T* op_buf = cpu::thread_scratch<T>(4, std::is_same_v<T, float> ? 0 : square);
    for (int64_t pair = p0; pair < p1; ++pair) {
      const T* q = x + h.q_offset(pair);
      const T* k = q + h.e;
      const T* v = q + 2 * h.e;
      const T* go = g + h.ctx_offset(pair);
      T* dq = dx + h.q_offset(pair);
      T* dk = dq + h.e;
      T* dv = dq + 2 * h.e;
      const uint8_t* kr = kp ? kp + pair * len * len : nullptr;
      // P, and the dropped P_drop that multiplied v
      product(false, true, len, len, h.d, 1.0, q, ld, k, ld, p, len);
      softmax_rows(p, pair, h, float(scale), masks, mask_buf, st, false);
      const float* p_drop = p;
      if (kr) {
        cpu::apply_keep_mask(pd, p, kr, ds, len * len);
        p_drop = pd;
      }
      // dV = P_drop^T dO
      product(true, false, len, h.d, len, 1.0, as_operand(p_drop, len * len, op_buf), len, go, h.e, dv, ld);
      // dP = dropout_backward(dO V^T); scale dS = scale P (dP - rowsum(dP P)), in place in dp (the
      // scale goes here rather than into the GEMMs: bf16 GEMMs with alpha != 1 are far slower)
      product(false, true, len, len, h.d, 1.0, go, h.e, v, ld, dp, len);
      for (int64_t i = 0; i < len; ++i) {
        float* dr = dp + i * len;
        const float* pr = p + i * len;
        if (kr) cpu::apply_keep_mask(dr, dr, kr + i * len, ds, len);
        const float dot = float(cpu::dot_row(dr, pr, len));
        int64_t j = 0;
        for (; j + cpu::kLanes <= len; j += cpu::kLanes)
          cpu::store8(dr + j, cpu::load8(pr + j) * (cpu::load8(dr + j) - dot) * sc);
        for (; j < len; ++j) dr[j] = pr[j] * (dr[j] - dot) * sc;
      }
      // dQ = (scale dS) K, dK = (scale dS)^T Q (straight into their columns of dqkv)
      const T* dsv = as_operand(dp, len * len, op_buf);
      product(false, false, len, h.d, len, 1.0, dsv, len, k, ld, dq, ld);
      product(true, false, len, h.d, len, 1.0, dsv, len, q, ld, dk, ld);
    }
  });
}

// ---- f64: the same steps in double, the softmax written plainly

void softmax_rows_double(double* s, int64_t pair, const Heads& h, double scale, const cpu::MaskRows<double>& masks,
                         double* mask_buf, double* stats, bool compute_stats) {
  const int64_t len = h.len;
  for (int64_t i = 0; i < len; ++i) {
    double* row = s + i * len;
    const int64_t r = pair * len + i;
    const double* mr = masks.defined() ? masks.row(r, len, mask_buf) : nullptr;
    for (int64_t j = 0; j < len; ++j) row[j] = row[j] * scale + (mr ? mr[j] : 0.0);
    if (compute_stats) {
      double m = -std::numeric_limits<double>::infinity();
      bool nan = false;
      for (int64_t j = 0; j < len; ++j) {
        nan |= std::isnan(row[j]);
        m = std::max(m, row[j]);
      }
      if (nan) m = std::numeric_limits<double>::quiet_NaN();
      double sum = 0;
      for (int64_t j = 0; j < len; ++j) sum += std::exp(row[j] - m);
      stats[2 * r] = m;
      stats[2 * r + 1] = 1.0 / sum;
    }
    for (int64_t j = 0; j < len; ++j) row[j] = std::exp(row[j] - stats[2 * r]) * stats[2 * r + 1];
  }
}

void forward_double(const Tensor& ctx, const Tensor& stats, const Tensor& keep, const Tensor& qkv, const Tensor& mask,
                    int64_t heads, double scale, const FusedDropout& d) {
  const Heads h = heads_of(qkv, heads);
  const int64_t len = h.len, ld = 3 * h.e;
  const double* x = qkv.data_ptr<double>();
  double* out = ctx.data_ptr<double>();
  double* st = stats.data_ptr<double>();
  uint8_t* kp = keep.defined() ? reinterpret_cast<uint8_t*>(keep.data_ptr<bool>()) : nullptr;
  const uint32_t threshold = d.active() ? cpu::dropout_threshold(d.p) : 0;
  const cpu::MaskRows<double> masks(mask, {h.batch, heads, len, len});
  parallel_for(0, h.pairs(), 1, [&](int64_t p0, int64_t p1) {
    std::vector<double> s(static_cast<size_t>(len * len)), mask_buf(static_cast<size_t>(len));
    for (int64_t pair = p0; pair < p1; ++pair) {
      const double* q = x + h.q_offset(pair);
      product(false, true, len, len, h.d, 1.0, q, ld, q + h.e, ld, s.data(), len);
      softmax_rows_double(s.data(), pair, h, scale, masks, mask_buf.data(), st, true);
      if (kp) {
        uint8_t* kr = kp + pair * len * len;
        cpu::dropout_keep_mask(d.state, threshold, pair * len * len, len * len, kr);
        for (int64_t j = 0; j < len * len; ++j) s[size_t(j)] *= kr[j] ? d.scale : 0.0;
      }
      product(false, false, len, h.d, len, 1.0, s.data(), len, q + 2 * h.e, ld, out + h.ctx_offset(pair), h.e);
    }
  });
}

void backward_double(const Tensor& dqkv, const Tensor& grad, const Tensor& qkv, const Tensor& mask, const Tensor& stats,
                     const Tensor& keep, int64_t heads, double scale, double dropout_scale) {
  const Heads h = heads_of(qkv, heads);
  const int64_t len = h.len, ld = 3 * h.e;
  const double* x = qkv.data_ptr<double>();
  const double* g = grad.data_ptr<double>();
  double* dx = dqkv.data_ptr<double>();
  double* st = stats.data_ptr<double>();
  const uint8_t* kp = keep.defined() ? reinterpret_cast<const uint8_t*>(keep.data_ptr<bool>()) : nullptr;
  const cpu::MaskRows<double> masks(mask, {h.batch, heads, len, len});
  parallel_for(0, h.pairs(), 1, [&](int64_t p0, int64_t p1) {
    const size_t square = static_cast<size_t>(len * len);
    std::vector<double> p(square), pd(square), dp(square), mask_buf(static_cast<size_t>(len));
    for (int64_t pair = p0; pair < p1; ++pair) {
      const double* q = x + h.q_offset(pair);
      const double* k = q + h.e;
      const double* v = q + 2 * h.e;
      const double* go = g + h.ctx_offset(pair);
      double* dq = dx + h.q_offset(pair);
      const uint8_t* kr = kp ? kp + pair * len * len : nullptr;
      product(false, true, len, len, h.d, 1.0, q, ld, k, ld, p.data(), len);
      softmax_rows_double(p.data(), pair, h, scale, masks, mask_buf.data(), st, false);
      for (int64_t j = 0; j < len * len; ++j) pd[size_t(j)] = p[size_t(j)] * (kr ? (kr[j] ? dropout_scale : 0.0) : 1.0);
      product(true, false, len, h.d, len, 1.0, pd.data(), len, go, h.e, dq + 2 * h.e, ld);
      product(false, true, len, len, h.d, 1.0, go, h.e, v, ld, dp.data(), len);
      for (int64_t i = 0; i < len; ++i) {
        double* dr = dp.data() + i * len;
        const double* pr = p.data() + i * len;
        double dot = 0;
        for (int64_t j = 0; j < len; ++j) {
          if (kr) dr[j] *= kr[i * len + j] ? dropout_scale : 0.0;
          dot += dr[j] * pr[j];
        }
        for (int64_t j = 0; j < len; ++j) dr[j] = pr[j] * (dr[j] - dot) * scale;
      }
      product(false, false, len, h.d, len, 1.0, dp.data(), len, k, ld, dq, ld);
      product(true, false, len, h.d, len, 1.0, dp.data(), len, q, ld, dq + h.e, ld);
    }
  });
}

void packed_attention_cpu(const Tensor& ctx, const Tensor& stats, const Tensor& keep, const Tensor& qkv,
                          const Tensor& mask, int64_t heads, double scale, const FusedDropout& d) {
  switch (qkv.dtype()) {
    case DType::f32: return forward_float<float>(ctx, stats, keep, qkv, mask, heads, scale, d);
    case DType::bf16: return forward_float<BFloat16>(ctx, stats, keep, qkv, mask, heads, scale, d);
    case DType::f64: return forward_double(ctx, stats, keep, qkv, mask, heads, scale, d);
    default: EMBER_FAIL("packed_self_attention: unsupported dtype ", dtype_name(qkv.dtype()));
  }
}

void packed_attention_backward_cpu(const Tensor& dqkv, const Tensor& grad, const Tensor& qkv, const Tensor& mask,
                                   const Tensor& stats, const Tensor& keep, int64_t heads, double scale,
                                   double dropout_scale) {
  switch (qkv.dtype()) {
    case DType::f32: return backward_float<float>(dqkv, grad, qkv, mask, stats, keep, heads, scale, dropout_scale);
    case DType::bf16: return backward_float<BFloat16>(dqkv, grad, qkv, mask, stats, keep, heads, scale, dropout_scale);
    case DType::f64: return backward_double(dqkv, grad, qkv, mask, stats, keep, heads, scale, dropout_scale);
    default: EMBER_FAIL("packed_self_attention_backward: unsupported dtype ", dtype_name(qkv.dtype()));
  }
}

}  // namespace

EMBER_REGISTER_KERNEL(native::packed_attention_stub, CPU, &packed_attention_cpu);
EMBER_REGISTER_KERNEL(native::packed_attention_backward_stub, CPU, &packed_attention_backward_cpu);

}  // namespace ember
