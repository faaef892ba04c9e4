// CPU softmax and log-softmax, forward and backward, over the [outer, len, inner] geometry
// of core/native/normalization.h. Values are computed in acc_t<T> (float for f32/f16/bf16,
// double for f64); row sums accumulate in double. The max is subtracted before exp, so
// large inputs never overflow. inner == 1 (softmax over the last dim) runs row by row;
// otherwise blocks of columns are processed together so the inner loops vectorise.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/native/normalization.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"

namespace ember {
namespace {
using native::SoftmaxGeometry;

constexpr int64_t kColBlock = 64;
constexpr int64_t kGrainElems = 8192;

// exp for float written so the compiler can vectorise it (std::exp is an opaque call):
// exp(x) = 2^n * exp(r) with n = round(x / ln 2), |r| <= ln2 / 2 and a degree-6 polynomial
// for exp(r); about 1 ulp. Results below ~1e-38 flush to 0; NaN stays NaN.
inline float exp_vec(float x_in) {
  float x = x_in < -87.3f ? -87.3f : x_in;  // below this the result is flushed to 0 at the end
  x = x > 88.0f ? 88.0f : x;
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;  // ln 2 split in two parts for an exact reduction
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  // 2^n built from its exponent bits; the magic constant turns n into an integer without a cast
  const float shifted = n + 12582912.0f;
  uint32_t bits;
  std::memcpy(&bits, &shifted, 4);
  const uint32_t pow2 = (bits - 0x4B400000u + 127u) << 23;
  float scale;
  std::memcpy(&scale, &pow2, 4);
  // exp(-inf) must be exactly 0 (masked attention scores)
  return x_in < -87.3f ? 0.0f : er * scale;
}
inline double exp_vec(double x) { return std::exp(x); }

// ---- forward

template <typename T>
void softmax_rows(T* out, const T* x, int64_t rows, int64_t len, bool log) {
  using A = acc_t<T>;
  const int64_t grain = std::max<int64_t>(1, kGrainElems / std::max<int64_t>(len, 1));
  parallel_for(0, rows, grain, [&](int64_t rb, int64_t re) {
    std::vector<A> buf(static_cast<size_t>(len));
    for (int64_t r = rb; r < re; ++r) {
      const T* xr = x + r * len;
      T* yr = out + r * len;
      A* v = buf.data();
      for (int64_t i = 0; i < len; ++i) v[i] = A(xr[i]);
      A m = v[0];
      bool nan = false;
      for (int64_t i = 0; i < len; ++i) {
        nan |= v[i] != v[i];
        m = v[i] > m ? v[i] : m;
      }
      if (nan) m = std::numeric_limits<A>::quiet_NaN();
      constexpr int kLanes = 8;
      double acc[kLanes] = {};
      int64_t i = 0;
      if (log) {
        for (; i + kLanes <= len; i += kLanes)
          for (int k = 0; k < kLanes; ++k) acc[k] += double(exp_vec(A(v[i + k] - m)));
        for (; i < len; ++i) acc[0] += double(exp_vec(A(v[i] - m)));
      } else {
        // keep exp(x - max) in buf for the normalisation pass
        for (; i + kLanes <= len; i += kLanes)
          for (int k = 0; k < kLanes; ++k) {
            v[i + k] = exp_vec(A(v[i + k] - m));
            acc[k] += double(v[i + k]);
          }
        for (; i < len; ++i) {
          v[i] = exp_vec(A(v[i] - m));
          acc[0] += double(v[i]);
        }
      }
      double s = 0;
      for (int k = 0; k < kLanes; ++k) s += acc[k];
      if (log) {
        // (x - max) is exact for nearby values; subtracting log(sum) after keeps small results accurate
        const A log_sum = A(std::log(s));
        for (int64_t j = 0; j < len; ++j) yr[j] = T((A(xr[j]) - m) - log_sum);
      } else {
        const A inv = A(1.0 / s);
        for (int64_t j = 0; j < len; ++j) yr[j] = T(v[j] * inv);
      }
    }
  });
}

template <typename T>
void softmax_columns(T* out, const T* x, const SoftmaxGeometry& g, bool log) {
  using A = acc_t<T>;
  const int64_t len = g.len, inner = g.inner;
  const int64_t nblocks = (inner + kColBlock - 1) / kColBlock;
  const int64_t grain = std::max<int64_t>(1, kGrainElems / (len * std::min(inner, kColBlock)));
  parallel_for(0, g.outer * nblocks, grain, [&](int64_t tb, int64_t te) {
    A m[kColBlock];
    double s[kColBlock];
    for (int64_t t = tb; t < te; ++t) {
      const int64_t o = t / nblocks, b0 = (t % nblocks) * kColBlock;
      const int64_t w = std::min(kColBlock, inner - b0);
      const T* xb = x + o * len * inner + b0;
      T* yb = out + o * len * inner + b0;
      for (int64_t j = 0; j < w; ++j) m[j] = A(xb[j]);
      for (int64_t r = 0; r < len; ++r)
        for (int64_t j = 0; j < w; ++j) {
          const A v = A(xb[r * inner + j]);
          m[j] = (v > m[j] || v != v) ? v : m[j];  // NaN sticks: it compares false afterwards
        }
      for (int64_t j = 0; j < w; ++j) s[j] = 0;
      for (int64_t r = 0; r < len; ++r)
        for (int64_t j = 0; j < w; ++j) s[j] += double(exp_vec(A(A(xb[r * inner + j]) - m[j])));
      if (log) {
        A log_sum[kColBlock];
        for (int64_t j = 0; j < w; ++j) log_sum[j] = A(std::log(s[j]));
        for (int64_t r = 0; r < len; ++r)
          for (int64_t j = 0; j < w; ++j) yb[r * inner + j] = T((A(xb[r * inner + j]) - m[j]) - log_sum[j]);
      } else {
        A inv[kColBlock];
        for (int64_t j = 0; j < w; ++j) inv[j] = A(1.0 / s[j]);
        for (int64_t r = 0; r < len; ++r)
          for (int64_t j = 0; j < w; ++j) yb[r * inner + j] = T(exp_vec(A(A(xb[r * inner + j]) - m[j])) * inv[j]);
      }
    }
  });
}

void softmax_cpu(const Tensor& out, const Tensor& x, const SoftmaxGeometry& g, bool log) {
  visit_floating(x.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = x.data_ptr<T>();
    T* op = out.data_ptr<T>();
    if (g.inner == 1) softmax_rows(op, xp, g.outer, g.len, log);
    else softmax_columns(op, xp, g, log);
  });
}

// ---- backward

template <typename T>
void softmax_backward_rows(T* dx, const T* gy, const T* y, int64_t rows, int64_t len, bool log) {
  using A = acc_t<T>;
  const int64_t grain = std::max<int64_t>(1, kGrainElems / std::max<int64_t>(len, 1));
  parallel_for(0, rows, grain, [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      const T* gr = gy + r * len;
      const T* yr = y + r * len;
      T* dr = dx + r * len;
      constexpr int kLanes = 8;
      double acc[kLanes] = {};
      int64_t i = 0;
      if (log) {
        for (; i + kLanes <= len; i += kLanes)
          for (int k = 0; k < kLanes; ++k) acc[k] += double(A(gr[i + k]));
        for (; i < len; ++i) acc[0] += double(A(gr[i]));
      } else {
        for (; i + kLanes <= len; i += kLanes)
          for (int k = 0; k < kLanes; ++k) acc[k] += double(A(gr[i + k]) * A(yr[i + k]));
        for (; i < len; ++i) acc[0] += double(A(gr[i]) * A(yr[i]));
      }
      double s = 0;
      for (int k = 0; k < kLanes; ++k) s += acc[k];
      const A sa = A(s);
      if (log) {
        for (int64_t j = 0; j < len; ++j) dr[j] = T(A(gr[j]) - exp_vec(A(yr[j])) * sa);
      } else {
        for (int64_t j = 0; j < len; ++j) dr[j] = T(A(yr[j]) * (A(gr[j]) - sa));
      }
    }
  });
}

template <typename T>
void softmax_backward_columns(T* dx, const T* gy, const T* y, const SoftmaxGeometry& g, bool log) {
  using A = acc_t<T>;
  const int64_t len = g.len, inner = g.inner;
  const int64_t nblocks = (inner + kColBlock - 1) / kColBlock;
  const int64_t grain = std::max<int64_t>(1, kGrainElems / (len * std::min(inner, kColBlock)));
  parallel_for(0, g.outer * nblocks, grain, [&](int64_t tb, int64_t te) {
    double s[kColBlock];
    A sa[kColBlock];
    for (int64_t t = tb; t < te; ++t) {
      const int64_t o = t / nblocks, b0 = (t % nblocks) * kColBlock;
      const int64_t w = std::min(kColBlock, inner - b0);
      const int64_t base = o * len * inner + b0;
      for (int64_t j = 0; j < w; ++j) s[j] = 0;
      for (int64_t r = 0; r < len; ++r) {
        const T* gr = gy + base + r * inner;
        const T* yr = y + base + r * inner;
        if (log)
          for (int64_t j = 0; j < w; ++j) s[j] += double(A(gr[j]));
        else
          for (int64_t j = 0; j < w; ++j) s[j] += double(A(gr[j]) * A(yr[j]));
      }
      for (int64_t j = 0; j < w; ++j) sa[j] = A(s[j]);
      for (int64_t r = 0; r < len; ++r) {
        const T* gr = gy + base + r * inner;
        const T* yr = y + base + r * inner;
        T* dr = dx + base + r * inner;
        if (log)
          for (int64_t j = 0; j < w; ++j) dr[j] = T(A(gr[j]) - exp_vec(A(yr[j])) * sa[j]);
        else
          for (int64_t j = 0; j < w; ++j) dr[j] = T(A(yr[j]) * (A(gr[j]) - sa[j]));
      }
    }
  });
}

void softmax_backward_cpu(const Tensor& grad_in, const Tensor& grad_out, const Tensor& y, const SoftmaxGeometry& g,
                          bool log) {
  visit_floating(y.dtype(), log ? "log_softmax_backward" : "softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* dx = grad_in.data_ptr<T>();
    const T* gy = grad_out.data_ptr<T>();
    const T* yp = y.data_ptr<T>();
    if (g.inner == 1) softmax_backward_rows(dx, gy, yp, g.outer, g.len, log);
    else softmax_backward_columns(dx, gy, yp, g, log);
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::softmax_stub, CPU, &softmax_cpu);
EMBER_REGISTER_KERNEL(native::softmax_backward_stub, CPU, &softmax_backward_cpu);

}  // namespace ember
