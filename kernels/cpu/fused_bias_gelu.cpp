// CPU bias + GELU, forward and backward (core/native/fused.h).
//
// Forward: one pass, y = gelu(x + b) on 8 float lanes, or 16 with AVX-512 (the lane formulas of
// kernels/cpu/gelu_lanes.inc, shared with the unary gelu). Backward: one pass writes
// dx = g * gelu'(x + b) and adds the unrounded dx rows into per-chunk double partial sums, which
// are then combined in chunk order: the bias gradient costs no extra pass over memory and does
// not depend on the thread count. f64 runs in double with libm.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/cpu_features.h"
#include "core/native/fused.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/gelu_avx512.h"
#include "kernels/cpu/gelu_math.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec_half.h"

namespace ember {
namespace {

using namespace cpu::vec8;

constexpr int64_t kRowsPerChunk = 32;

// ---- double (f64 data)

double gelu_f64(double x, bool tanh_approx) {
  if (tanh_approx) return 0.5 * x * (1.0 + std::tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
  return 0.5 * x * std::erfc(-x * 0.70710678118654752440);
}

double gelu_grad_f64(double x, bool tanh_approx) {
  if (tanh_approx) {
    const double x2 = x * x;
    const double t = std::tanh(0.79788456080286535588 * x * (1.0 + 0.044715 * x2));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.79788456080286535588 * (1.0 + 3.0 * 0.044715 * x2);
  }
  return 0.5 * std::erfc(-x * 0.70710678118654752440) + x * 0.39894228040143267794 * std::exp(-0.5 * x * x);
}

// ---- float lanes, forced inline: as calls they passed every vector through memory (bias +
// exact GELU forward on [4096, 1024], one thread: 6.2 -> 8.0 GB/s)

template <bool Tanh>
EMBER_LANES_INLINE f8 act8(f8 v) {
  if constexpr (Tanh) return gelu_tanh8(v);
  else return gelu8(v);
}
template <bool Tanh>
EMBER_LANES_INLINE f8 act_grad8(f8 v) {
  if constexpr (Tanh) return gelu_tanh_grad8(v);
  else return gelu_grad8(v);
}

template <typename T>
constexpr bool has_avx512_rows_v = std::is_same_v<T, float> || std::is_same_v<T, BFloat16>;

template <typename T, bool Tanh>
void forward_row(T* y, const T* x, const float* b, int64_t n, bool avx512) {
  if constexpr (has_avx512_rows_v<T>) {
    if (avx512) return cpu::gelu_forward_row_avx512(y, x, b, n, Tanh);
  }
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store8(y + i, act8<Tanh>(load8(x + i) + load8(b + i)));
  if (i < n) store_part(y + i, act8<Tanh>(load_part(x + i, n - i, 0.0f) + load_part(b + i, n - i, 0.0f)), n - i);
}

// d[j] = g[j] * gelu'(x[j] + b[j]) in float.
template <typename T, bool Tanh>
void backward_row(float* d, const T* g, const T* x, const float* b, int64_t n, bool avx512) {
  if constexpr (has_avx512_rows_v<T>) {
    if (avx512) return cpu::gelu_backward_row_avx512(d, g, x, b, n, Tanh);
  }
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store8(d + i, load8(g + i) * act_grad8<Tanh>(load8(x + i) + load8(b + i)));
  if (i < n) {
    const f8 v = load_part(x + i, n - i, 0.0f) + load_part(b + i, n - i, 0.0f);
    store_part(d + i, load_part(g + i, n - i, 0.0f) * act_grad8<Tanh>(v), n - i);
  }
}

template <typename T, bool Tanh>
void forward_typed(T* y, const T* x, const acc_t<T>* b, int64_t rows, int64_t cols) {
  const int64_t grain = std::max<int64_t>(1, 16384 / cols);
  const bool avx512 = cpu_capability() == CpuCapability::Avx512;
  parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if constexpr (std::is_same_v<T, double>) {
        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = gelu_f64(x[r * cols + j] + b[j], Tanh);
      } else {
        forward_row<T, Tanh>(y + r * cols, x + r * cols, b, cols, avx512);
      }
    }
  });
}

// Rows [r0, r1): dx (may be null) and, when part is not null, the column sums of dx added into it.
template <typename T, bool Tanh>
void backward_rows(T* dx, double* part, const T* g, const T* x, const acc_t<T>* b, int64_t r0, int64_t r1, int64_t cols,
                   acc_t<T>* buf, bool avx512) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* gr = g + r * cols;
    const T* xr = x + r * cols;
    // the row in acc_t<T>: straight into dx when that is its type
    acc_t<T>* d = buf;
    if constexpr (std::is_same_v<T, acc_t<T>>) {
      if (dx) d = dx + r * cols;
    }
    if constexpr (std::is_same_v<T, double>) {
      for (int64_t j = 0; j < cols; ++j) d[j] = gr[j] * gelu_grad_f64(xr[j] + b[j], Tanh);
    } else {
      backward_row<T, Tanh>(d, gr, xr, b, cols, avx512);
    }
    if constexpr (!std::is_same_v<T, acc_t<T>>) {
      if (dx) convert_row(dx + r * cols, d, cols);
    }
    if (part)
      for (int64_t j = 0; j < cols; ++j) part[j] += double(d[j]);
  }
}

template <typename T, bool Tanh>
void backward_typed(T* dx, acc_t<T>* dbias, const T* g, const T* x, const acc_t<T>* b, int64_t rows, int64_t cols) {
  const int64_t nchunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  // per-chunk partial sums of the bias gradient (scratch slot 0 of this thread; chunks use slot 1)
  double* partials = dbias ? cpu::thread_scratch<double>(0, size_t(nchunks * cols)) : nullptr;
  if (partials) std::fill(partials, partials + nchunks * cols, 0.0);
  const bool avx512 = cpu_capability() == CpuCapability::Avx512;
  parallel_for(0, nchunks, 1, [&](int64_t c0, int64_t c1) {
    acc_t<T>* buf = cpu::thread_scratch<acc_t<T>>(1, static_cast<size_t>(cols));
    for (int64_t c = c0; c < c1; ++c) {
      backward_rows<T, Tanh>(dx, dbias ? partials + c * cols : nullptr, g, x, b, c * kRowsPerChunk,
                             std::min(rows, (c + 1) * kRowsPerChunk), cols, buf, avx512);
    }
  });
  if (!dbias) return;
  parallel_for(0, cols, 256, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      double s = 0;
      for (int64_t c = 0; c < nchunks; ++c) s += partials[size_t(c * cols + j)];
      dbias[j] = acc_t<T>(s);
    }
  });
}

// Run `fn(type_tag<T>, bool_constant<tanh>)` for the data dtype.
template <typename Fn>
void dispatch(DType dt, bool tanh_approx, const char* op, const Fn& fn) {
  visit_floating(dt, op, [&](auto tag) {
    if (tanh_approx) fn(tag, std::true_type{});
    else fn(tag, std::false_type{});
  });
}

void bias_gelu_cpu(const Tensor& y, const Tensor& x, const Tensor& bias, bool tanh_approx) {
  const int64_t cols = x.shape().back(), rows = x.numel() / cols;
  dispatch(x.dtype(), tanh_approx, "bias_gelu", [&](auto tag, auto tanh) {
    using T = typename decltype(tag)::type;
    forward_typed<T, decltype(tanh)::value>(y.data_ptr<T>(), x.data_ptr<T>(), bias.data_ptr<acc_t<T>>(), rows, cols);
  });
}

void bias_gelu_backward_cpu(const Tensor& dx, const Tensor& dbias, const Tensor& grad, const Tensor& x,
                            const Tensor& bias, bool tanh_approx) {
  const int64_t cols = x.shape().back(), rows = x.numel() / cols;
  dispatch(x.dtype(), tanh_approx, "bias_gelu_backward", [&](auto tag, auto tanh) {
    using T = typename decltype(tag)::type;
    backward_typed<T, decltype(tanh)::value>(dx.defined() ? dx.data_ptr<T>() : nullptr,
                                             dbias.defined() ? dbias.data_ptr<acc_t<T>>() : nullptr, grad.data_ptr<T>(),
                                             x.data_ptr<T>(), bias.data_ptr<acc_t<T>>(), rows, cols);
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::bias_gelu_stub, CPU, &bias_gelu_cpu);
EMBER_REGISTER_KERNEL(native::bias_gelu_backward_stub, CPU, &bias_gelu_backward_cpu);

}  // namespace ember
