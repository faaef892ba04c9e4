// CPU attention, forward and backward (core/native/fused.h): packed_self_attention and
// scaled_dot_product_attention share these kernels through native::AttentionProblem.
//
// Work is split by (batch, head) pairs. Each pair reads its q, k and v rows in place (any row
// stride: the GEMMs take strided operands) and keeps its len_q x len_k scores in a per-thread
// buffer: S = q k^T, the scaled and masked softmax and dropout of each row (the row code of
// kernels/cpu/fused_softmax_rows.h and the mask stream of kernels/cpu/dropout_mask.h, as
// scaled_masked_softmax uses), then out = P v written straight into the pair's rows of the
// output. Nothing of size len_q x len_k reaches memory but the dropout's keep mask. Causal
// problems go in blocks of query rows, each block's products reaching only the keys its last
// row sees, and the backward's dV and dK in blocks of keys, each reaching only the rows that see
// them: about half the work of the full square.
//
// Backward, per pair: S and P are recomputed bit for bit from q, k, the mask and the saved row
// statistics, then
//   dV = P_drop^T dO,  dP = dropout_backward(dO V^T),  dS = P (dP - rowsum(dP P)),
//   dQ = scale dS K,   dK = scale dS^T Q  (the scale applied to dS, not in the GEMMs),
// each written into its own layout. bf16 runs the products as bf16 GEMMs accumulating in f32
// (scores in f32), with the softmax in float; f64 runs in double throughout.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/native/fused.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/dropout_mask.h"
#include "kernels/cpu/fused_softmax_rows.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec_half.h"

namespace ember {
namespace {

using native::AttentionOperand;
using native::AttentionProblem;
using native::FusedDropout;

// Query rows per block of a causal problem (a non-causal one is one block).
constexpr int64_t kCausalBlock = 64;

int64_t block_rows(const AttentionProblem& a) { return a.causal ? kCausalBlock : std::max<int64_t>(a.len_q, 1); }
// Keys query row i sees, and the keys any row below `end` sees.
int64_t visible_keys(const AttentionProblem& a, int64_t i) { return a.causal ? std::min(i + 1, a.len_k) : a.len_k; }
int64_t block_width(const AttentionProblem& a, int64_t end) { return a.causal ? std::min(end, a.len_k) : a.len_k; }

// The scores' type: float for f32 and bf16 data, double for f64.
template <typename T>
using score_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// A pair's rows of one operand.
template <typename T>
struct Rows {
  T* p;
  int64_t ld;
};
template <typename T>
Rows<T> rows_of(const AttentionOperand& o, int64_t pair, int64_t inner) {
  return {o.data.data_ptr<std::remove_const_t<T>>() + o.offset(pair, inner), o.row_stride};
}

// C = alpha op(A) op(B) through cpu::gemm (gemm.h's layout conventions). C is T, or float for
// bf16 operands (bf16 products accumulate in f32 either way).
template <typename T, typename C>
void product(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb,
             C* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, BFloat16>) {
    cpu::gemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
  } else {
    static_assert(std::is_same_v<T, C>);
    cpu::gemm<T>(ta, tb, m, n, k, T(1), a, lda, b, ldb, T(0), c, ldc);
  }
}

// Rows [r0, r1) (first `width` columns, ld `ld`) of score values as T operands: a copy into buf
// for bf16, the values themselves otherwise.
template <typename T, typename A>
const T* as_operand(const A* src, int64_t r0, int64_t r1, int64_t width, int64_t ld, T* buf) {
  if constexpr (std::is_same_v<T, A>) {
    return src;
  } else {
    for (int64_t i = r0; i < r1; ++i) cpu::vec8::convert_row(buf + i * ld, src + i * ld, width);
    return buf;
  }
}

// ---- rows of scores, float and double

// R rows (n unscaled scores q.k each) into probabilities: scaled, masked, exponentiated and
// normalised with the saved statistics st = {max, 1 / sum} of each row, or with new ones written
// there. Float rows share kernels/cpu/fused_softmax_rows.h with scaled_masked_softmax (on 16
// lanes where wide).
template <int R>
void softmax_rows(float* const* rows, int64_t n, const float* const* mask, float scale, float* st, bool compute,
                  bool wide) {
  if (compute) {
    cpu::scaled_masked_softmax_rows<R, float>(rows, rows, mask, scale, n, st, wide);
  } else {
    cpu::scaled_masked_softmax_rows_again<R, float>(rows, rows, mask, scale, n, st, wide);
  }
}

template <int R>
void softmax_rows(double* const* rows, int64_t n, const double* const* mask, double scale, double* st, bool compute,
                  bool /*wide*/) {
  static_assert(R == 1, "double rows go one at a time");
  double* row = rows[0];
  for (int64_t j = 0; j < n; ++j) row[j] = row[j] * scale + (mask[0] ? mask[0][j] : 0.0);
  if (compute) {
    double m = -std::numeric_limits<double>::infinity();
    bool nan = false;
    for (int64_t j = 0; j < n; ++j) {
      nan |= std::isnan(row[j]);
      m = std::max(m, row[j]);
    }
    if (nan) m = std::numeric_limits<double>::quiet_NaN();
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += std::exp(row[j] - m);
    st[0] = m;
    st[1] = 1.0 / sum;
  }
  for (int64_t j = 0; j < n; ++j) row[j] = std::exp(row[j] - st[0]) * st[1];
}

void drop_row(float* out, const float* x, const uint8_t* keep, double scale, int64_t n) {
  cpu::apply_keep_mask(out, x, keep, float(scale), n);
}
void drop_row(double* out, const double* x, const uint8_t* keep, double scale, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = x[j] * (keep[j] ? scale : 0.0);
}

// dr = scale * p (dr - rowsum(dr p)): the softmax backward of one row, in place.
void softmax_grad_row(float* dr, const float* p, int64_t n, float scale) {
  const float dot = float(cpu::dot_row(dr, p, n));
  int64_t j = 0;
  for (; j + cpu::kLanes <= n; j += cpu::kLanes)
    cpu::store8(dr + j, cpu::load8(p + j) * (cpu::load8(dr + j) - dot) * scale);
  for (; j < n; ++j) dr[j] = p[j] * (dr[j] - dot) * scale;
}
void softmax_grad_row(double* dr, const double* p, int64_t n, double scale) {
  double dot = 0;
  for (int64_t j = 0; j < n; ++j) dot += dr[j] * p[j];
  for (int64_t j = 0; j < n; ++j) dr[j] = p[j] * (dr[j] - dot) * scale;
}

// ---- the pair loops

// Rows [i0, i1) of the pair's probabilities into s (ld len_k): the scores q k^T over the block's
// keys, then each row's softmax over the keys it sees (zeros up to `zero_to` beyond them).
// mask_buf holds two rows of len_k. wide: float rows on 16 lanes (cpu::wide_rows()).
template <typename T, typename A>
void probability_rows(const AttentionProblem& a, int64_t pair, int64_t i0, int64_t i1, Rows<const T> q,
                      Rows<const T> k, const cpu::MaskRows<A>& masks, A* mask_buf, A* stats, bool compute_stats,
                      A* s, int64_t zero_to, bool wide) {
  const int64_t len_k = a.len_k;
  product(false, true, i1 - i0, block_width(a, i1), a.dim_qk, q.p + i0 * q.ld, q.ld, k.p, k.ld, s + i0 * len_k, len_k);
  // rows i .. i + R - 1, which see the same keys
  auto softmax_group = [&](int64_t i, auto group) {
    constexpr int R = decltype(group)::value;
    const int64_t r = pair * a.len_q + i, n = visible_keys(a, i);
    A* row[R];
    const A* mr[R];
    for (int t = 0; t < R; ++t) {
      row[t] = s + (i + t) * len_k;
      mr[t] = masks.defined() ? masks.row(r + t, len_k, mask_buf + t * len_k) : nullptr;
    }
    softmax_rows<R>(row, n, mr, A(a.scale), stats + 2 * r, compute_stats, wide);
    for (int t = 0; t < R; ++t) std::fill(row[t] + n, row[t] + std::max(n, zero_to), A(0));
  };
  // rows in pairs where they see the same keys: float rows of a problem that is not causal
  if constexpr (std::is_same_v<A, float>) {
    if (!a.causal) return cpu::for_row_pairs(i0, i1, softmax_group);
  }
  for (int64_t i = i0; i < i1; ++i) softmax_group(i, std::integral_constant<int, 1>{});
}

// out[j] = sum_i lhs[i, j] rhs[i] for every key j (lhs [len_q, len_k], ld len_k: P_drop or dS):
// dV and dK. Causal problems go in blocks of keys, each summing only the query rows that see them
// (i >= j; lhs is zero above its diagonal); keys no query row sees get zero.
template <typename T>
void key_rows_product(const AttentionProblem& a, const T* lhs, Rows<const T> rhs, int64_t cols, Rows<T> out) {
  const int64_t len_q = a.len_q, len_k = a.len_k;
  if (!a.causal) {
    product(true, false, len_k, cols, len_q, lhs, len_k, rhs.p, rhs.ld, out.p, out.ld);
    return;
  }
  for (int64_t j0 = 0; j0 < len_k; j0 += kCausalBlock) {
    const int64_t j1 = std::min(len_k, j0 + kCausalBlock);
    if (j0 >= len_q) {
      for (int64_t j = j0; j < len_k; ++j) std::fill(out.p + j * out.ld, out.p + j * out.ld + cols, T(0.0f));
      return;
    }
    product(true, false, j1 - j0, cols, len_q - j0, lhs + j0 * len_k + j0, len_k, rhs.p + j0 * rhs.ld, rhs.ld,
            out.p + j0 * out.ld, out.ld);
  }
}

template <typename T>
void attention_forward(const AttentionProblem& a, const AttentionOperand& out, const Tensor& stats,
                       const Tensor& keep, const FusedDropout& d) {
  using A = score_t<T>;
  const int64_t len_q = a.len_q, len_k = a.len_k, square = len_q * len_k;
  A* st = stats.data_ptr<A>();
  uint8_t* kp = keep.defined() ? reinterpret_cast<uint8_t*>(keep.data_ptr<bool>()) : nullptr;
  const uint32_t threshold = d.active() ? cpu::dropout_threshold(d.p) : 0;
  const cpu::MaskRows<A> masks(a.mask, {a.outer, a.inner, len_q, len_k});
  const int64_t block = block_rows(a);
  const bool wide = cpu::wide_rows();
  parallel_for(0, a.pairs(), 1, [&](int64_t p0, int64_t p1) {
    A* s = cpu::thread_scratch<A>(0, size_t(square));
    A* mask_buf = cpu::thread_scratch<A>(1, 2 * size_t(len_k));
    T* op_buf = cpu::thread_scratch<T>(2, std::is_same_v<T, A> ? 0 : size_t(square));
    for (int64_t pair = p0; pair < p1; ++pair) {
      const Rows<const T> q = rows_of<const T>(a.q, pair, a.inner), k = rows_of<const T>(a.k, pair, a.inner),
                          v = rows_of<const T>(a.v, pair, a.inner);
      const Rows<T> o = rows_of<T>(out, pair, a.inner);
      for (int64_t i0 = 0; i0 < len_q; i0 += block) {
        const int64_t i1 = std::min(len_q, i0 + block), w = block_width(a, i1);
        probability_rows<T, A>(a, pair, i0, i1, q, k, masks, mask_buf, st, true, s, w, wide);
        if (kp) {
          uint8_t* kr = kp + pair * square;
          cpu::dropout_keep_mask(d.state, threshold, pair * square + i0 * len_k, (i1 - i0) * len_k, kr + i0 * len_k);
          for (int64_t i = i0; i < i1; ++i) drop_row(s + i * len_k, s + i * len_k, kr + i * len_k, d.scale, w);
        }
        const T* probs = as_operand(s, i0, i1, w, len_k, op_buf);
        product(false, false, i1 - i0, a.dim_v, w, probs + i0 * len_k, len_k, v.p, v.ld, o.p + i0 * o.ld, o.ld);
      }
    }
  });
}

template <typename T>
void attention_backward(const AttentionProblem& a, const AttentionOperand& grad, const AttentionOperand& dq_out,
                        const AttentionOperand& dk_out, const AttentionOperand& dv_out, const Tensor& stats,
                        const Tensor& keep, double dropout_scale) {
  using A = score_t<T>;
  const int64_t len_q = a.len_q, len_k = a.len_k, square = len_q * len_k;
  A* st = stats.data_ptr<A>();
  const uint8_t* kp = keep.defined() ? reinterpret_cast<const uint8_t*>(keep.data_ptr<bool>()) : nullptr;
  const cpu::MaskRows<A> masks(a.mask, {a.outer, a.inner, len_q, len_k});
  const int64_t block = block_rows(a);
  const bool wide = cpu::wide_rows();
  parallel_for(0, a.pairs(), 1, [&](int64_t p0, int64_t p1) {
    A* p = cpu::thread_scratch<A>(0, size_t(square));
    A* pd = cpu::thread_scratch<A>(1, kp ? size_t(square) : 0);
    A* dp = cpu::thread_scratch<A>(2, size_t(square));
    A* mask_buf = cpu::thread_scratch<A>(3, 2 * size_t(len_k));
    T* op_buf = cpu::thread_scratch<T>(4, std::is_same_v<T, A> ? 0 : size_t(square));
    for (int64_t pair = p0; pair < p1; ++pair) {
      const Rows<const T> q = rows_of<const T>(a.q, pair, a.inner), k = rows_of<const T>(a.k, pair, a.inner),
                          v = rows_of<const T>(a.v, pair, a.inner), go = rows_of<const T>(grad, pair, a.inner);
      const Rows<T> dq = rows_of<T>(dq_out, pair, a.inner), dk = rows_of<T>(dk_out, pair, a.inner),
                    dv = rows_of<T>(dv_out, pair, a.inner);
      const uint8_t* kr = kp ? kp + pair * square : nullptr;
      // P (whole rows, zero past the keys a row sees: the dV and dK products read columns), and
      // P_drop that multiplied v
      for (int64_t i0 = 0; i0 < len_q; i0 += block)
        probability_rows<T, A>(a, pair, i0, std::min(len_q, i0 + block), q, k, masks, mask_buf, st, false, p, len_k,
                               wide);
      const A* p_drop = p;
      if (kr) {
        drop_row(pd, p, kr, dropout_scale, square);
        p_drop = pd;
      }
      // dV = P_drop^T dO
      key_rows_product<T>(a, as_operand(p_drop, 0, len_q, len_k, len_k, op_buf), go, a.dim_v, dv);
      // dP = dropout_backward(dO V^T); scale dS = scale P (dP - rowsum(dP P)), in place in dp (the
      // scale goes here rather than into the GEMMs: bf16 GEMMs with alpha != 1 are far slower)
      for (int64_t i0 = 0; i0 < len_q; i0 += block) {
        const int64_t i1 = std::min(len_q, i0 + block);
        product(false, true, i1 - i0, block_width(a, i1), a.dim_v, go.p + i0 * go.ld, go.ld, v.p, v.ld,
                dp + i0 * len_k, len_k);
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t n = visible_keys(a, i);
          A* dr = dp + i * len_k;
          if (kr) drop_row(dr, dr, kr + i * len_k, dropout_scale, n);
          softmax_grad_row(dr, p + i * len_k, n, A(a.scale));
          std::fill(dr + n, dr + len_k, A(0));
        }
      }
      // dQ = (scale dS) K, over the keys each block sees; dK = (scale dS)^T Q
      const T* dsv = as_operand(dp, 0, len_q, len_k, len_k, op_buf);
      for (int64_t i0 = 0; i0 < len_q; i0 += block) {
        const int64_t i1 = std::min(len_q, i0 + block);
        product(false, false, i1 - i0, a.dim_qk, block_width(a, i1), dsv + i0 * len_k, len_k, k.p, k.ld,
                dq.p + i0 * dq.ld, dq.ld);
      }
      key_rows_product<T>(a, dsv, q, a.dim_qk, dk);
    }
  });
}

void attention_cpu(const AttentionProblem& a, const AttentionOperand& out, const Tensor& stats, const Tensor& keep,
                   const FusedDropout& d) {
  switch (a.q.data.dtype()) {
    case DType::f32: return attention_forward<float>(a, out, stats, keep, d);
    case DType::bf16: return attention_forward<BFloat16>(a, out, stats, keep, d);
    case DType::f64: return attention_forward<double>(a, out, stats, keep, d);
    default: EMBER_FAIL("attention: unsupported dtype ", dtype_name(a.q.data.dtype()));
  }
}

void attention_backward_cpu(const AttentionProblem& a, const AttentionOperand& grad, const AttentionOperand& dq,
                            const AttentionOperand& dk, const AttentionOperand& dv, const Tensor& stats,
                            const Tensor& keep, double dropout_scale) {
  switch (a.q.data.dtype()) {
    case DType::f32: return attention_backward<float>(a, grad, dq, dk, dv, stats, keep, dropout_scale);
    case DType::bf16: return attention_backward<BFloat16>(a, grad, dq, dk, dv, stats, keep, dropout_scale);
    case DType::f64: return attention_backward<double>(a, grad, dq, dk, dv, stats, keep, dropout_scale);
    default: EMBER_FAIL("attention_backward: unsupported dtype ", dtype_name(a.q.data.dtype()));
  }
}

}  // namespace

EMBER_REGISTER_KERNEL(native::attention_stub, CPU, &attention_cpu);
EMBER_REGISTER_KERNEL(native::attention_backward_stub, CPU, &attention_backward_cpu);

}  // namespace ember
