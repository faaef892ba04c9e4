// CPU scale + additive mask + softmax (+ dropout) over the last dim (core/native/fused.h).
//
// Forward, one row at a time in float (x may be f32, bf16 or f16, the mask too):
//   v = x * scale + mask,  m = max v,  e = exp(v - m),  y = e / sum e,  then the dropout,
// reading x and the mask once and writing y (and the keep mask) once. The row maximum and
// 1 / sum are saved instead of y: the backward recomputes e and y bit for bit from x, which costs
// a few operations per element but no pass over a saved copy of the probabilities.
// Row sums accumulate in float lanes flushed into double every 512 elements. f64 runs in double.
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
using cpu::exp_row;
using cpu::MaskRows;
using cpu::row_max;
using cpu::scale_row;
using cpu::scores_row;
using cpu::with_lane_type;
using native::FusedDropout;

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
  char* yp = static_cast<char*>(y.raw_data());
  const int64_t y_elem = int64_t(y.element_size());
  parallel_for(0, rows, std::max<int64_t>(1, 8192 / len), [&](int64_t r0, int64_t r1) {
    const size_t n = static_cast<size_t>(len);
    const bool out_float = out_dt == DType::f32;  // then the row is computed in place in y
    std::vector<float> buf(out_float ? 0 : n), mbuf(masks.defined() ? n : 0);
    for (int64_t r = r0; r < r1; ++r) {
      float* v = out_float ? reinterpret_cast<float*>(yp + r * len * y_elem) : buf.data();
      const float* mr = masks.defined() ? masks.row(r, len, mbuf.data()) : nullptr;
      scores_row(v, xp + r * len, mr, sc, len);
      const float m = row_max(v, len);
      const float inv = float(1.0 / exp_row(v, len, m));
      scale_row(v, len, inv);
      if (kp) {
        cpu::dropout_keep_mask(d.state, threshold, r * len, len, kp + r * len);
        cpu::apply_keep_mask(v, v, kp + r * len, float(d.scale), len);
      }
      if (!out_float) {
        with_lane_type(out_dt, "scaled_masked_softmax", [&](auto tag) {
          using O = typename decltype(tag)::type;
          if constexpr (!std::is_same_v<O, float>) convert_row(reinterpret_cast<O*>(yp + r * len * y_elem), v, len);
        });
      }
      sp[2 * r] = m;
      sp[2 * r + 1] = inv;
    }
  });
}

template <typename T>
void backward_float(const Tensor& dx, const Tensor& grad, const Tensor& x, const Tensor& mask, const Tensor& stats,
                    const Tensor& keep, double scale, double out_scale, double dropout_scale) {
  const int64_t len = x.shape().back(), rows = x.numel() / len;
  const T* xp = x.data_ptr<T>();
  T* dp = dx.data_ptr<T>();
  const float* sp = stats.data_ptr<float>();
  const uint8_t* kp = keep.defined() ? reinterpret_cast<const uint8_t*>(keep.data_ptr<bool>()) : nullptr;
  const MaskRows<float> masks(mask, x.shape());
  const float sc = float(scale), osc = float(out_scale);
  const char* gp = static_cast<const char*>(grad.raw_data());
  const int64_t g_elem = int64_t(grad.element_size());
  parallel_for(0, rows, std::max<int64_t>(1, 8192 / len), [&](int64_t r0, int64_t r1) {
    const size_t n = static_cast<size_t>(len);
    std::vector<float> y(n), g(n), mbuf(masks.defined() ? n : 0);
    for (int64_t r = r0; r < r1; ++r) {
      const float* mr = masks.defined() ? masks.row(r, len, mbuf.data()) : nullptr;
      scores_row(y.data(), xp + r * len, mr, sc, len);
      exp_row(y.data(), len, sp[2 * r]);
      scale_row(y.data(), len, sp[2 * r + 1]);
      // the output gradient as floats, through the dropout
      const float* gq = g.data();
      const void* grow = gp + r * len * g_elem;
      if (grad.dtype() == DType::f32) {
        gq = static_cast<const float*>(grow);
        if (kp) {
          cpu::apply_keep_mask(g.data(), gq, kp + r * len, float(dropout_scale), len);
          gq = g.data();
        }
      } else {
        with_lane_type(grad.dtype(), "scaled_masked_softmax_backward", [&](auto tag) {
          using G = typename decltype(tag)::type;
          if constexpr (!std::is_same_v<G, float>) convert_row(g.data(), static_cast<const G*>(grow), len);
        });
        if (kp) cpu::apply_keep_mask(g.data(), g.data(), kp + r * len, float(dropout_scale), len);
      }
      const float dot = float(dot_row(gq, y.data(), len));
      T* out = dp + r * len;
      int64_t i = 0;
      for (; i + kLanes <= len; i += kLanes) store8(out + i, osc * (load8(y.data() + i) * (load8(gq + i) - dot)));
      for (; i < len; ++i) out[i] = T(osc * (y[size_t(i)] * (gq[i] - dot)));
    }
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
