// CPU scale + additive mask + softmax (+ dropout) over the last dim (core/native/fused.h).
//
// Forward, in float (x may be f32, bf16 or f16, the mask too), two rows at a time
// (kernels/cpu/fused_softmax_rows.h), or on 16 lanes where the CPU has AVX-512 a block of rows in
// one pipelined call (kernels/cpu/softmax_avx512.h), the same bits:
//   v = x * scale + mask,  m = max v,  e = exp(v - m),  y = e / sum e,  then the dropout,
// reading x and the mask once and writing y (and the keep mask) once. The row maximum and
// 1 / sum are saved instead of y: the backward recomputes e and y bit for bit from x, which costs
// a few operations per element but no pass over a saved copy of the probabilities.
// Row sums accumulate in float lanes flushed into double every 512 elements. f64 runs in double.
//
// Measured on AMD EPYC Zen 3 (AVX2), one thread, [16, 4, 128, 128] f32 with a [16, 1, 1, 128]
// mask (build/bench/bench_ops BM_ScaledMaskedSoftmax; best of 4 runs alternating with the
// previous library): 0.67 ns per element, 11.9 GB/s (0.76 ns, 10.6 GB/s, before the scores and
// their max shared a pass). Compute-bound like the plain softmax: an exp per element. On an
// Intel Xeon (family 6 model 207) with the 16-lane rows, best of 12 runs alternating with the
// AVX2-only library: 18.4 GB/s at one thread and 34.4 at two (0.67 and 0.63 of its L3 copy
// bandwidth), against 13.0 and 24.9.
// The backward on 16 lanes takes two passes a row instead of five: the probabilities (recomputed
// as the forward's bits) go straight into dx with the dot product of g and p beside them, then
// dx = p (g - dot) in place; each pass prefetches the rows of the group after next a line a step.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/native/fused.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/dropout_mask.h"
#include "kernels/cpu/fused_softmax_rows.h"
#include "kernels/cpu/vec_half.h"

namespace ember {
namespace {

using namespace cpu::vec8;
using cpu::dot_row;
using cpu::MaskRows;
using cpu::with_lane_type;
using native::FusedDropout;

// Rows r .. r + R - 1 as the row code takes them: x's rows, their mask rows (gathered into
// mask_buf, len floats a row, where not used in place) and the float rows y_row(k) for the
// probabilities.
template <int R, typename T>
struct RowGroup {
  float* y[R];
  const T* x[R];
  const float* mask[R];
  template <typename YRow>
  RowGroup(int64_t r, int64_t len, const T* xp, const MaskRows<float>& masks, float* mask_buf, const YRow& y_row) {
    for (int k = 0; k < R; ++k) {
      y[k] = y_row(k);
      x[k] = xp + (r + k) * len;
      mask[k] = masks.defined() ? masks.row(r + k, len, mask_buf + k * len) : nullptr;
    }
  }
};

// The mask rows of rows b0 .. b1 - 1 into ms (null without a mask): a row that shares the mask
// row of the one before reuses its pointer, so each mask row is found (or gathered into mbuf,
// len floats a row) once.
void mask_rows_of_block(const MaskRows<float>& masks, int64_t b0, int64_t b1, int64_t len, float* mbuf,
                        const float** ms) {
  if (!masks.defined()) {
    std::fill(ms, ms + (b1 - b0), nullptr);
    return;
  }
  const int64_t shared = masks.rows_sharing_a_row();
  int64_t in_run = b0 % shared;  // rows before this one that share its mask row
  for (int64_t r = b0; r < b1; ++r, in_run = in_run + 1 == shared ? 0 : in_run + 1) {
    const int64_t k = r - b0;
    ms[k] = k > 0 && in_run > 0 ? ms[k - 1] : masks.row(r, len, mbuf + k * len);
  }
}

// Rows the forward sets up at a time (their pointers, their gathered mask rows): the 16-lane row
// code takes them in one call (cpu::ScaledMaskedSoftmaxAvx512::run), which overlaps each group of
// rows with the next; the 8-lane code takes them in pairs.
int64_t forward_block_rows(int64_t len) { return std::clamp<int64_t>(16384 / len, 4, 64); }

template <typename T>
void forward_float(const Tensor& y, const Tensor& stats, const Tensor& keep, const Tensor& x, const Tensor& mask,
                   double scale, const FusedDropout& d) {
  const int64_t len = x.shape().back(), rows = x.numel() / len;
  const T* xp = x.data_ptr<T>();
  float* sp = stats.data_ptr<float>();
  uint8_t* kp = keep.defined() ? reinterpret_cast<uint8_t*>(keep.data_ptr<bool>()) : nullptr;
  const uint32_t threshold = d.active() ? cpu::dropout_threshold(d.p) : 0;
  const MaskRows<float> masks(mask, x.shape());
  const float sc = float(scale);
  const DType out_dt = y.dtype();
  const bool wide = cpu::wide_rows();
  char* yp = static_cast<char*>(y.raw_data());
  const int64_t y_elem = int64_t(y.element_size());
  parallel_for(0, rows, std::max<int64_t>(1, 8192 / len), [&](int64_t r0, int64_t r1) {
    const size_t n = static_cast<size_t>(len);
    const bool out_float = out_dt == DType::f32;  // then rows are computed in place in y
    const int64_t block = std::min(r1 - r0, forward_block_rows(len));
    const size_t block_elems = size_t(block) * n;
    std::vector<float> buf(out_float ? 0 : block_elems), mbuf(masks.defined() ? block_elems : 0);
    std::vector<float*> ys(size_t(block), nullptr);
    std::vector<const T*> xs(size_t(block), nullptr);
    std::vector<const float*> ms(size_t(block), nullptr);
    for (int64_t b0 = r0; b0 < r1; b0 += block) {
      const int64_t b1 = std::min(r1, b0 + block);
      // the block's rows: in place in y, or in buf
      float* const y0 = out_float ? reinterpret_cast<float*>(yp) + b0 * len : buf.data();
      for (int64_t k = 0; k < b1 - b0; ++k) ys[size_t(k)] = y0 + k * len, xs[size_t(k)] = xp + (b0 + k) * len;
      mask_rows_of_block(masks, b0, b1, len, mbuf.data(), ms.data());
      if (wide) {
        cpu::ScaledMaskedSoftmaxAvx512<T>::run(b1 - b0, ys.data(), xs.data(), ms.data(), sc, len, sp + 2 * b0);
      } else {
        cpu::for_row_pairs(b0, b1, [&](int64_t r, auto group) {
          constexpr int R = decltype(group)::value;
          const size_t k = size_t(r - b0);
          cpu::scaled_masked_softmax_rows<R>(ys.data() + k, xs.data() + k, ms.data() + k, sc, len, sp + 2 * r, wide);
        });
      }
      for (int64_t row = b0; row < b1; ++row) {
        float* v = ys[size_t(row - b0)];
        if (kp) {
          cpu::dropout_keep_mask(d.state, threshold, row * len, len, kp + row * len);
          cpu::apply_keep_mask(v, v, kp + row * len, float(d.scale), len);
        }
        if (!out_float) {
          with_lane_type(out_dt, "scaled_masked_softmax", [&](auto tag) {
            using O = typename decltype(tag)::type;
            if constexpr (!std::is_same_v<O, float>) convert_row(reinterpret_cast<O*>(yp + row * len * y_elem), v, len);
          });
        }
      }
    }
  });
}

// The backward's operands, for the 16-lane and the 8-lane drivers alike.
template <typename T>
struct BackwardOperands {
  BackwardOperands(const Tensor& dx, const Tensor& grad, const Tensor& x, const Tensor& mask, const Tensor& stats,
                   const Tensor& keep, double dropout_scale)
      : len(x.shape().back()),
        rows(x.numel() / len),
        xp(x.data_ptr<T>()),
        dp(dx.data_ptr<T>()),
        sp(stats.data_ptr<float>()),
        kp(keep.defined() ? reinterpret_cast<const uint8_t*>(keep.data_ptr<bool>()) : nullptr),
        masks(mask, x.shape()),
        gp(static_cast<const char*>(grad.raw_data())),
        g_dt(grad.dtype()),
        g_elem(int64_t(grad.element_size())),
        keep_scale(float(dropout_scale)) {}

  // Whether grad_row reads f32 rows of the output gradient where they are.
  bool grad_in_place() const { return g_dt == DType::f32 && !kp; }

  // Row r of the output gradient as floats, through the dropout: in place where grad_in_place,
  // else written to buf (len floats).
  const float* grad_row(int64_t r, float* buf) const {
    const void* row = gp + r * len * g_elem;
    if (g_dt == DType::f32) {
      if (!kp) return static_cast<const float*>(row);
      cpu::apply_keep_mask(buf, static_cast<const float*>(row), kp + r * len, keep_scale, len);
      return buf;
    }
    with_lane_type(g_dt, "scaled_masked_softmax_backward", [&](auto tag) {
      using G = typename decltype(tag)::type;
      if constexpr (!std::is_same_v<G, float>) convert_row(buf, static_cast<const G*>(row), len);
    });
    if (kp) cpu::apply_keep_mask(buf, buf, kp + r * len, keep_scale, len);
    return buf;
  }

  int64_t len, rows;
  const T* xp;
  T* dp;
  const float* sp;
  const uint8_t* kp;
  MaskRows<float> masks;
  const char* gp;
  DType g_dt;
  int64_t g_elem;
  float keep_scale;
};

// The backward on 16 lanes (cpu::ScaledMaskedSoftmaxAvx512::backward_run), the same bits as
// backward_float's 8-lane rows: a block of rows at a time, their output gradients as floats
// (through the dropout) and their float dx, in place where dx is f32.
template <typename T>
void backward_float_wide(const BackwardOperands<T>& o, double scale, double out_scale) {
  const int64_t len = o.len;
  parallel_for(0, o.rows, std::max<int64_t>(1, 8192 / len), [&](int64_t r0, int64_t r1) {
    const int64_t block = std::min(r1 - r0, forward_block_rows(len));
    const size_t block_elems = size_t(block * len);
    constexpr bool dx_in_place = std::is_same_v<T, float>;
    std::vector<float> gbuf(o.grad_in_place() ? 0 : block_elems), dxbuf(dx_in_place ? 0 : block_elems);
    std::vector<float> mbuf(o.masks.defined() ? block_elems : 0);
    std::vector<float*> dxs(size_t(block), nullptr);
    std::vector<const T*> xs(size_t(block), nullptr);
    std::vector<const float*> ms(size_t(block), nullptr), gs(size_t(block), nullptr);
    for (int64_t b0 = r0; b0 < r1; b0 += block) {
      const int64_t b1 = std::min(r1, b0 + block);
      for (int64_t r = b0; r < b1; ++r) {
        const size_t k = size_t(r - b0);
        xs[k] = o.xp + r * len;
        if constexpr (dx_in_place) {
          dxs[k] = o.dp + r * len;
        } else {
          dxs[k] = dxbuf.data() + k * size_t(len);
        }
        gs[k] = o.grad_row(r, o.grad_in_place() ? nullptr : gbuf.data() + k * size_t(len));
      }
      mask_rows_of_block(o.masks, b0, b1, len, mbuf.data(), ms.data());
      cpu::ScaledMaskedSoftmaxAvx512<T>::backward_run(b1 - b0, dxs.data(), xs.data(), ms.data(), gs.data(),
                                                      float(scale), float(out_scale), len, o.sp + 2 * b0);
      if constexpr (!dx_in_place)
        for (int64_t r = b0; r < b1; ++r) convert_row(o.dp + r * len, dxs[size_t(r - b0)], len);
    }
  });
}

template <typename T>
void backward_float(const Tensor& dx, const Tensor& grad, const Tensor& x, const Tensor& mask, const Tensor& stats,
                    const Tensor& keep, double scale, double out_scale, double dropout_scale) {
  const BackwardOperands<T> o(dx, grad, x, mask, stats, keep, dropout_scale);
  if (cpu::wide_rows()) return backward_float_wide<T>(o, scale, out_scale);
  const int64_t len = o.len;
  const float sc = float(scale), osc = float(out_scale);
  parallel_for(0, o.rows, std::max<int64_t>(1, 8192 / len), [&](int64_t r0, int64_t r1) {
    const size_t n = static_cast<size_t>(len);
    std::vector<float> y(2 * n), g(n), mbuf(o.masks.defined() ? 2 * n : 0);
    // dx of row r from its probabilities p
    auto grad_row = [&](int64_t r, const float* p) {
      const float* gq = o.grad_row(r, g.data());
      const float dot = float(dot_row(gq, p, len));
      T* out = o.dp + r * len;
      int64_t i = 0;
      for (; i + kLanes <= len; i += kLanes) store8(out + i, osc * (load8(p + i) * (load8(gq + i) - dot)));
      for (; i < len; ++i) out[i] = T(osc * (p[i] * (gq[i] - dot)));
    };
    cpu::for_row_pairs(r0, r1, [&](int64_t r, auto group) {
      constexpr int R = decltype(group)::value;
      const RowGroup<R, T> rows(r, len, o.xp, o.masks, mbuf.data(), [&](int64_t k) { return y.data() + k * n; });
      cpu::scaled_masked_softmax_rows_again<R>(rows.y, rows.x, rows.mask, sc, len, o.sp + 2 * r, false);
      for (int k = 0; k < R; ++k) grad_row(r + k, rows.y[k]);
    });
  });
}

// ---- f64

void forward_double(const Tensor& y, const Tensor& stats, const Tensor& keep, const Tensor& x, const Tensor& mask,
                    double scale, const FusedDropout& d) {
  const int64_t len = x.shape().back(), rows = x.numel() / len;
  const double* xp = x.data_ptr<double>();
  double* yp = y.data_ptr<double>();
  double* sp = stats.data_ptr<double>();
  uint8_t* kp = keep.defined() ? reinterpret_cast<uint8_t*>(keep.data_ptr<bool>()) : nullptr;
  const uint32_t threshold = d.active() ? cpu::dropout_threshold(d.p) : 0;
  const MaskRows<double> masks(mask, x.shape());
  parallel_for(0, rows, std::max<int64_t>(1, 4096 / len), [&](int64_t r0, int64_t r1) {
    std::vector<double> mbuf(masks.defined() ? size_t(len) : 0);
    for (int64_t r = r0; r < r1; ++r) {
      const double* mr = masks.defined() ? masks.row(r, len, mbuf.data()) : nullptr;
      double* yr = yp + r * len;
      double m = -std::numeric_limits<double>::infinity();
      bool nan = false;
      for (int64_t j = 0; j < len; ++j) {
        yr[j] = xp[r * len + j] * scale + (mr ? mr[j] : 0.0);
        nan |= std::isnan(yr[j]);
        m = std::max(m, yr[j]);
      }
      if (nan) m = std::numeric_limits<double>::quiet_NaN();
      double s = 0;
      for (int64_t j = 0; j < len; ++j) s += (yr[j] = std::exp(yr[j] - m));
      const double inv = 1.0 / s;
      if (kp) cpu::dropout_keep_mask(d.state, threshold, r * len, len, kp + r * len);
      for (int64_t j = 0; j < len; ++j) yr[j] = yr[j] * inv * (kp ? (kp[r * len + j] ? d.scale : 0.0) : 1.0);
      sp[2 * r] = m;
      sp[2 * r + 1] = inv;
    }
  });
}

void backward_double(const Tensor& dx, const Tensor& grad, const Tensor& x, const Tensor& mask, const Tensor& stats,
                     const Tensor& keep, double scale, double out_scale, double dropout_scale) {
  const int64_t len = x.shape().back(), rows = x.numel() / len;
  const double* xp = x.data_ptr<double>();
  const double* gp = grad.data_ptr<double>();
  const double* sp = stats.data_ptr<double>();
  double* dp = dx.data_ptr<double>();
  const uint8_t* kp = keep.defined() ? reinterpret_cast<const uint8_t*>(keep.data_ptr<bool>()) : nullptr;
  const MaskRows<double> masks(mask, x.shape());
  parallel_for(0, rows, std::max<int64_t>(1, 4096 / len), [&](int64_t r0, int64_t r1) {
    const size_t n = static_cast<size_t>(len);
    std::vector<double> y(n), g(n), mbuf(masks.defined() ? n : 0);
    for (int64_t r = r0; r < r1; ++r) {
      const double* mr = masks.defined() ? masks.row(r, len, mbuf.data()) : nullptr;
      double dot = 0;
      for (int64_t j = 0; j < len; ++j) {
        y[size_t(j)] = std::exp(xp[r * len + j] * scale + (mr ? mr[j] : 0.0) - sp[2 * r]) * sp[2 * r + 1];
        g[size_t(j)] = gp[r * len + j] * (kp ? (kp[r * len + j] ? dropout_scale : 0.0) : 1.0);
        dot += g[size_t(j)] * y[size_t(j)];
      }
      for (int64_t j = 0; j < len; ++j) dp[r * len + j] = out_scale * y[size_t(j)] * (g[size_t(j)] - dot);
    }
  });
}

void scaled_masked_softmax_cpu(const Tensor& y, const Tensor& stats, const Tensor& keep, const Tensor& x,
                               const Tensor& mask, double scale, const FusedDropout& d) {
  if (x.dtype() == DType::f64) return forward_double(y, stats, keep, x, mask, scale, d);
  with_lane_type(x.dtype(), "scaled_masked_softmax",
                 [&](auto tag) { forward_float<typename decltype(tag)::type>(y, stats, keep, x, mask, scale, d); });
}

void scaled_masked_softmax_backward_cpu(const Tensor& dx, const Tensor& grad, const Tensor& x, const Tensor& mask,
                                        const Tensor& stats, const Tensor& keep, double scale, double out_scale,
                                        double dropout_scale) {
  if (x.dtype() == DType::f64) return backward_double(dx, grad, x, mask, stats, keep, scale, out_scale, dropout_scale);
  with_lane_type(x.dtype(), "scaled_masked_softmax_backward", [&](auto tag) {
    backward_float<typename decltype(tag)::type>(dx, grad, x, mask, stats, keep, scale, out_scale, dropout_scale);
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::scaled_masked_softmax_stub, CPU, &scaled_masked_softmax_cpu);
EMBER_REGISTER_KERNEL(native::scaled_masked_softmax_backward_stub, CPU, &scaled_masked_softmax_backward_cpu);

}  // namespace ember
