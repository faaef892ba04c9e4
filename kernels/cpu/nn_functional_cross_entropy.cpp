// CPU cross-entropy, fused: each (n, d) row of C logits is read once for its max (and sum, for
// label smoothing) and once for its sum of exponentials (the second read from cache); the
// backward writes g * (softmax - target distribution) in one more pass, and for
// linear_cross_entropy also sums those values into the bias gradient as it writes them. Rows
// whose target is ignore_index cost nothing in the forward, which matters for
// masked-language-model losses where most are.
//
// f16/bf16/f32 rows compute in float with a vectorisable exp; f64 rows use std::exp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/native/nn_functional.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"

namespace ember {
namespace {

// e^x for x <= 0 (also fine slightly above 0): Cody-Waite reduction x = n ln2 + r, a degree-6
// polynomial for e^r, and 2^n built in the exponent bits. Relative error below 1e-7; exactly 0
// below -87 (and for -inf); NaN stays NaN. The clamp is a bit mask rather than a float select:
// GCC keeps -ftrapping-math by default and will not vectorise a loop with a float branch.
inline float exp_nonpositive(float x) {
  constexpr uint32_t kMinus87 = 0xC2AE0000u;  // bits of -87.0f
  uint32_t xb;
  std::memcpy(&xb, &x, 4);
  // Negative floats order like their unsigned bits; NaNs are left alone.
  const bool below = (xb > kMinus87) & ((xb & 0x7fffffffu) <= 0x7f800000u);
  const uint32_t keep_mask = uint32_t(below) - 1u;  // all ones when x is kept as is
  const uint32_t cb = (xb & keep_mask) | (kMinus87 & ~keep_mask);
  float xc;
  std::memcpy(&xc, &cb, 4);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low bits
  const float t = xc * 1.44269504088896341f + kRound;
  const float n = t - kRound;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  uint32_t tb;
  std::memcpy(&tb, &t, 4);
  const uint32_t scale_bits = ((tb - 0x4B400000u + 127u) << 23) & keep_mask;  // 2^n, or 0
  float scale;
  std::memcpy(&scale, &scale_bits, 4);
  return y * scale;
}
inline double exp_nonpositive(double x) { return std::exp(x); }

// Log-sum-exp of a contiguous row; `sum` gets the plain sum of the row (for label smoothing).
// Partial results live in kLanes independent lanes so the loops vectorise without reassociation
// flags; the lanes combine in a fixed order, so results never depend on the thread count.
constexpr int kLanes = 8;

template <typename A>
A row_logsumexp(const A* x, int64_t c, A* sum) {
  A lane_max[kLanes];
  for (int k = 0; k < kLanes; ++k) lane_max[k] = -std::numeric_limits<A>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= c; i += kLanes)
    for (int k = 0; k < kLanes; ++k) lane_max[k] = x[i + k] > lane_max[k] ? x[i + k] : lane_max[k];
  A m = lane_max[0];
  for (int k = 1; k < kLanes; ++k) m = lane_max[k] > m ? lane_max[k] : m;
  for (; i < c; ++i) m = x[i] > m ? x[i] : m;

  A lane_exp[kLanes] = {}, lane_sum[kLanes] = {};
  i = 0;
  for (; i + kLanes <= c; i += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      lane_exp[k] += exp_nonpositive(x[i + k] - m);
      lane_sum[k] += x[i + k];
    }
  A e = 0, total = 0;
  for (int k = 0; k < kLanes; ++k) {
    e += lane_exp[k];
    total += lane_sum[k];
  }
  for (; i < c; ++i) {
    e += exp_nonpositive(x[i] - m);
    total += x[i];
  }
  *sum = total;
  return m + std::log(e);
}

// Points at row (n, d) as a contiguous acc-type array, copying (and converting) when needed.
template <typename T, typename A>
const A* load_row(const T* logits, int64_t base, int64_t c, int64_t stride, A* buf) {
  if constexpr (std::is_same_v<T, A>) {
    if (stride == 1) return logits + base;
  }
  for (int64_t i = 0; i < c; ++i) buf[i] = A(logits[base + i * stride]);
  return buf;
}

[[noreturn]] void fail_target(int64_t t, int64_t c, int64_t ignore_index) {
  EMBER_FAIL("cross_entropy: target ", t, " is out of bounds for ", c, " classes (valid range [0, ", c,
             "), or ignore_index ", ignore_index, ")");
}

int64_t cross_entropy_cpu(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                          const native::CrossEntropyArgs& args) {
  const int64_t n = logits.size(0), c = logits.size(1), d = logits.size(2), rows = n * d;
  std::vector<double> row_loss(size_t(rows), 0.0);
  std::vector<uint8_t> counted(size_t(rows), 0);
  int64_t count = 0;
  visit_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* x = logits.data_ptr<T>();
    A* lse_out = lse.data_ptr<A>();
    const double eps = args.label_smoothing;
    visit_index(target.dtype(), "cross_entropy", [&](auto itag) {
      using I = typename decltype(itag)::type;
      const I* tgt = target.data_ptr<I>();
      parallel_for(0, rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(c, 1)), [&](int64_t b, int64_t e) {
        std::vector<A> buf(static_cast<size_t>(c));
        for (int64_t r = b; r < e; ++r) {
          const int64_t t = int64_t(tgt[r]);
          if (t == args.ignore_index) {
            lse_out[r] = A(0);
            continue;
          }
          if (t < 0 || t >= c) fail_target(t, c, args.ignore_index);
          const A* row = load_row<T, A>(x, (r / d) * c * d + r % d, c, d, buf.data());
          A sum = 0;
          const A l = row_logsumexp(row, c, &sum);
          lse_out[r] = l;
          double v = double(l) - double(row[t]);
          if (eps > 0) v = (1.0 - eps) * v + eps * (double(l) - double(sum) / double(c));
          row_loss[size_t(r)] = v;
          counted[size_t(r)] = 1;
        }
      });
    });
    for (uint8_t k : counted) count += k;
    // Reductions run in row order on one thread: the same bits for any thread count.
    auto write = [&](auto* out) {
      using O = std::remove_pointer_t<decltype(out)>;
      if (args.reduction == Reduction::None) {
        for (int64_t r = 0; r < rows; ++r) out[r] = O(A(row_loss[size_t(r)]));
      } else {
        double total = 0.0;
        for (int64_t r = 0; r < rows; ++r) total += row_loss[size_t(r)];
        out[0] = O(A(args.reduction == Reduction::Mean ? total / double(count) : total));
      }
    };
    if (loss.dtype() == logits.dtype()) write(loss.data_ptr<T>());
    else write(loss.data_ptr<A>());
  });
  return count;
}

// What every gradient row needs: the saved forward and the upstream gradient.
template <typename T, typename I>
struct BackwardRows {
  using A = acc_t<T>;
  const T* x;
  const I* tgt;
  const A* lse;
  const A* g;
  T* out;
  int64_t c, d;
  const native::CrossEntropyArgs& args;
  int64_t count;

  // Writes the gradient of logits row r as row out_r of grad_logits; adds its unrounded values
  // into bias_sums when given (an ignored row is zero and adds nothing). buf and grad hold c
  // values each.
  void write(int64_t r, int64_t out_r, A* buf, A* grad, double* bias_sums) const {
    const int64_t base = (r / d) * c * d + r % d, out_base = (out_r / d) * c * d + out_r % d;
    const int64_t t = int64_t(tgt[r]);
    const bool direct = std::is_same_v<T, A> && d == 1;
    A* dst = direct ? reinterpret_cast<A*>(out + out_base) : grad;
    if (t == args.ignore_index) {
      std::fill(dst, dst + c, A(0));
    } else {
      const A eps = A(args.label_smoothing);
      const A off_target = eps / A(c);  // smoothed probability of every class
      const A on_target = A(1) - eps;   // extra probability of the target class
      const A coef = args.reduction == Reduction::None   ? g[r]
                     : args.reduction == Reduction::Mean ? A(double(g[0]) / double(count))
                                                         : g[0];
      const A* row = load_row<T, A>(x, base, c, d, buf);
      const A l = lse[r];
      for (int64_t i = 0; i < c; ++i) dst[i] = coef * (exp_nonpositive(row[i] - l) - off_target);
      dst[t] -= coef * on_target;
      if (bias_sums)
        for (int64_t i = 0; i < c; ++i) bias_sums[i] += double(dst[i]);
    }
    if (!direct)
      for (int64_t i = 0; i < c; ++i) out[out_base + i * d] = T(dst[i]);
  }
};

template <typename Body>
void visit_backward_rows(const Tensor& grad_logits, const Tensor& grad_loss, const Tensor& logits,
                         const Tensor& target, const Tensor& lse, const native::CrossEntropyArgs& args, int64_t count,
                         const char* op, const Body& body) {
  visit_floating(logits.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    visit_index(target.dtype(), op, [&](auto itag) {
      using I = typename decltype(itag)::type;
      const BackwardRows<T, I> rows{logits.data_ptr<T>(), target.data_ptr<I>(), lse.data_ptr<A>(),
                                    grad_loss.data_ptr<A>(), grad_logits.data_ptr<T>(), logits.size(1),
                                    logits.size(2), args, count};
      body(rows);
    });
  });
}

void cross_entropy_backward_cpu(const Tensor& grad_logits, const Tensor& grad_loss, const Tensor& logits,
                                const Tensor& target, const Tensor& lse, const native::CrossEntropyArgs& args,
                                int64_t count) {
  const int64_t c = logits.size(1), rows = logits.size(0) * logits.size(2);
  visit_backward_rows(grad_logits, grad_loss, logits, target, lse, args, count, "cross_entropy_backward",
                      [&](const auto& br) {
                        using A = typename std::remove_reference_t<decltype(br)>::A;
                        parallel_for(0, rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(c, 1)),
                                     [&](int64_t b, int64_t e) {
                                       std::vector<A> buf(static_cast<size_t>(c)), grad(static_cast<size_t>(c));
                                       for (int64_t r = b; r < e; ++r) br.write(r, r, buf.data(), grad.data(), nullptr);
                                     });
                      });
}

// Rows per partial column sum of the bias gradient: fixed, so the sums are formed in the same
// order whatever the thread count; large, so the partials ([blocks, C] doubles) stay a few MiB.
constexpr int64_t kBiasBlockRows = 256;

void linear_cross_entropy_backward_cpu(const Tensor& grad_logits, const Tensor& grad_bias, const Tensor& grad_loss,
                                       const Tensor& logits, const Tensor& target, const Tensor& lse,
                                       const Tensor& row_index, const native::CrossEntropyArgs& args, int64_t count) {
  const int64_t c = logits.size(1), rows = logits.size(0);
  // The rows written, ascending: all of them, or only those listed in row_index.
  std::vector<int64_t> written;
  if (row_index.defined()) {
    const int64_t* idx = row_index.data_ptr<int64_t>();
    written.assign(idx, idx + row_index.numel());
  }
  const bool all_rows = !row_index.defined();
  auto source_row = [&](int64_t k) { return all_rows ? k : written[size_t(k)]; };
  const int64_t out_rows = all_rows ? rows : int64_t(written.size());
  // Bias blocks follow the logits' rows, not the written ones: a block sums the same values in
  // the same order whichever rows are written (a skipped row would only have added zeros).
  const int64_t blocks = (rows + kBiasBlockRows - 1) / kBiasBlockRows;
  std::vector<int64_t> block_start(size_t(blocks + 1), out_rows);  // first written row of each block
  for (int64_t blk = 0, k = 0; blk <= blocks; ++blk) {
    while (k < out_rows && source_row(k) < blk * kBiasBlockRows) ++k;
    block_start[size_t(blk)] = k;
  }
  std::vector<double> partial(size_t(std::max<int64_t>(blocks, 1) * c), 0.0);
  visit_backward_rows(grad_logits, grad_loss, logits, target, lse, args, count, "linear_cross_entropy_backward",
                      [&](const auto& br) {
                        using A = typename std::remove_reference_t<decltype(br)>::A;
                        parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
                          std::vector<A> buf(static_cast<size_t>(c)), grad(static_cast<size_t>(c));
                          for (int64_t blk = b0; blk < b1; ++blk) {
                            double* sums = partial.data() + blk * c;
                            for (int64_t k = block_start[size_t(blk)]; k < block_start[size_t(blk + 1)]; ++k)
                              br.write(source_row(k), k, buf.data(), grad.data(), sums);
                          }
                        });
                        // Blocks added in order, column by column.
                        A* db = grad_bias.data_ptr<A>();
                        parallel_for(0, c, 4096, [&](int64_t j0, int64_t j1) {
                          for (int64_t j = j0; j < j1; ++j) {
                            double total = 0.0;
                            for (int64_t blk = 0; blk < blocks; ++blk) total += partial[size_t(blk * c + j)];
                            db[j] = A(total);
                          }
                        });
                      });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::cross_entropy_stub, CPU, &cross_entropy_cpu);
EMBER_REGISTER_KERNEL(native::cross_entropy_backward_stub, CPU, &cross_entropy_backward_cpu);
EMBER_REGISTER_KERNEL(native::linear_cross_entropy_backward_stub, CPU, &linear_cross_entropy_backward_cpu);

}  // namespace ember
