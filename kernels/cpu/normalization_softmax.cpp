// CPU softmax and log-softmax, forward and backward, over the [outer, len, inner] geometry
// of core/native/normalization.h.
//
// Everything runs on rows: with inner == 1 (softmax over the last dim, the attention case)
// the rows are the tensor's own; otherwise a tile of columns is copied out transposed, run
// through the same row code and copied back. f32/f16/bf16 rows are computed in float with
// explicit 8-lane vectors (GCC/Clang vector extensions: the float compares in max and exp
// would otherwise keep the auto-vectoriser away) and row sums accumulate in double;
// f64 rows are computed in double. The row max is subtracted before exp, so large inputs
// never overflow, and a NaN anywhere in a row makes the whole row NaN.
//
// Measured on AMD EPYC Zen 3 (AVX2), one thread, f32 rows of 128 (build/bench/bench_ops
// BM_Softmax, best of 4 runs alternating with the previous library): 0.59 ns per element,
// 13.6 GB/s (0.61 ns two rows at a time; 0.64 ns before that, 0.77 one row at a time).
// Compute-bound: each element costs an exp (16 vector instructions per 8 lanes), and a row's max,
// exp and sum are chains of dependent steps, so rows are taken three at a time to overlap their
// chains (the row code of kernels/cpu/softmax_rows.h, which the scaled masked softmax shares).
// Where the CPU has AVX-512 the forward rows run on 16 lanes, the same bits
// (kernels/cpu/softmax_avx512.h), f32 rows a thread's share in one pipelined call. On an Intel
// Xeon (family 6 model 207), BM_Softmax, best of 12 runs alternating with the AVX2-only library:
// 25.3 GB/s at one thread and 52.3 at two, 0.93 and 0.96 of the machine's L3 copy bandwidth
// (build/bench/machine_limits: 27.3 / 54.6), against 13.5 and 27.0. The softmax backward, 8 lanes
// still, already moves its bytes at the L3 limit there; log_softmax (cross-entropy's), forward and
// backward, runs on 16 lanes too, one row at a time.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/native/normalization.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/softmax_rows.h"
#include "kernels/cpu/vec8.h"
#include "kernels/cpu/vec_half.h"

namespace ember {
namespace {
using native::SoftmaxGeometry;
using namespace cpu::vec8;
using cpu::exp_shifted_rows;
using cpu::kSoftmaxFlush;
using cpu::rows_max;

constexpr int64_t kGrainElems = 8192;
constexpr int64_t kColTile = 16;  // columns transposed into rows at a time
// Float rows of the forward at a time: three overlap their chains of dependent steps better than
// two (0.55 against 0.59 ns per element for rows of 128 on Zen 3); four gain nothing more.
constexpr int kRowGroup = 3;

float row_max(const float* v, int64_t n) {
  float m;
  rows_max<1>(&m, &v, n);
  return m;
}

// Sums of a float row (or of elementwise products a*b) in double: float lanes are flushed
// into double every block, so long rows keep double accuracy.
// Two chains of adds, one for the first and one for the second 8 of every 16 elements (as
// exp_shifted_rows), so they do not set the pace and the 16-lane rows can keep the order.
template <typename Load>
double row_sum(int64_t n, const Load& load) {
  double total = 0;
  for (int64_t b = 0; b < n; b += kSoftmaxFlush) {
    const int64_t e = std::min(n, b + kSoftmaxFlush);
    f8 acc = f8{}, acc2 = f8{};
    int64_t i = b;
    for (; i + 2 * kLanes <= e; i += 2 * kLanes) acc += load(i, kLanes), acc2 += load(i + kLanes, kLanes);
    for (; i + kLanes <= e; i += kLanes) acc += load(i, kLanes);
    if (i < e) acc += load(i, e - i);
    total += hsum(acc + acc2);
  }
  return total;
}

double exp_shifted(float* e, const float* v, int64_t n, float m) {
  double total;
  float* const* es = e ? &e : nullptr;
  exp_shifted_rows<1>(&total, es, &v, n, &m);
  return total;
}

// ---- one row, in float (f32/f16/bf16 data) or double (f64)

// y[r] = softmax(x[r]) for R rows at once (kernels/cpu/softmax_rows.h, on 16 lanes where wide);
// x and y may alias.
template <int R>
void softmax_rows(float* const* y, const float* const* x, int64_t n, bool wide) {
  float m[R], inv[R];
  cpu::softmax_rows<R>(y, x, n, m, inv, wide);
}

// y = softmax(x) or log_softmax(x); x and y may alias.
void softmax_row(float* y, const float* x, int64_t n, bool log, bool wide) {
  if (!log) return softmax_rows<1>(&y, &x, n, wide);
  if (wide) return cpu::log_softmax_row_avx512(y, x, n);
  // (x - max) is exact for nearby values; subtracting log(sum) after keeps small results accurate
  const float m = row_max(x, n);
  const float log_sum = float(std::log(exp_shifted(nullptr, x, n, m)));
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store8(y + i, (load8(x + i) - m) - log_sum);
  for (; i < n; ++i) y[i] = (x[i] - m) - log_sum;
}

void softmax_row(double* y, const double* x, int64_t n, bool log, bool /*wide*/) {
  double m = x[0];
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    nan |= std::isnan(x[i]);
    m = x[i] > m ? x[i] : m;
  }
  if (nan) m = std::numeric_limits<double>::quiet_NaN();
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(x[i] - m);
  if (log) {
    const double log_sum = std::log(s);
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) - log_sum;
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i] - m) / s;
  }
}

// dx from g and y; dx may alias g. One row at a time: rows of 128 with their dot products in
// pairs measured no faster (best of 300 interleaved runs on Zen 3), unlike the forward's exps.
void softmax_backward_row(float* dx, const float* g, const float* y, int64_t n, bool log, bool wide) {
  if (log && wide) return cpu::log_softmax_backward_row_avx512(dx, g, y, n);
  if (log) {
    const float gs = float(row_sum(n, [&](int64_t i, int64_t k) {
      return k == kLanes ? load8(g + i) : load_tail(g + i, k, 0.0f);
    }));
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) store8(dx + i, load8(g + i) - exp8(load8(y + i)) * gs);
    if (i < n) store_tail(dx + i, load_tail(g + i, n - i, 0.0f) - exp8(load_tail(y + i, n - i, 0.0f)) * gs, n - i);
  } else {
    const float dot = float(row_sum(n, [&](int64_t i, int64_t k) {
      return k == kLanes ? load8(g + i) * load8(y + i) : load_tail(g + i, k, 0.0f) * load_tail(y + i, k, 0.0f);
    }));
    for (int64_t i = 0; i < n; ++i) dx[i] = y[i] * (g[i] - dot);
  }
}

void softmax_backward_row(double* dx, const double* g, const double* y, int64_t n, bool log, bool /*wide*/) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += log ? g[i] : g[i] * y[i];
  if (log) {
    for (int64_t i = 0; i < n; ++i) dx[i] = g[i] - std::exp(y[i]) * s;
  } else {
    for (int64_t i = 0; i < n; ++i) dx[i] = y[i] * (g[i] - s);
  }
}

// ---- rows of T: converted to A = acc_t<T> in per-thread buffers unless T is A already

template <typename A, typename T>
const A* as_acc(const T* p, int64_t n, std::vector<A>& buf) {
  if constexpr (std::is_same_v<A, T>) {
    return p;
  } else if constexpr (std::is_same_v<A, float>) {
    cpu::vec8::convert_row(buf.data(), p, n);
    return buf.data();
  } else {
    for (int64_t i = 0; i < n; ++i) buf[size_t(i)] = A(p[i]);
    return buf.data();
  }
}

template <typename T>
void softmax_forward(T* out, const T* x, const SoftmaxGeometry& g, bool log) {
  using A = acc_t<T>;
  const int64_t len = g.len, inner = g.inner;
  const bool wide = cpu::wide_rows();
  if (inner == 1) {
    const int64_t grain = std::max<int64_t>(1, kGrainElems / len);
    parallel_for(0, g.outer, grain, [&](int64_t rb, int64_t re) {
      if constexpr (std::is_same_v<T, float>) {
        // f32 rows on 16 lanes go in one call, which overlaps one group of rows with the next
        if (wide && !log) return cpu::softmax_row_run_avx512(out + rb * len, x + rb * len, re - rb, len);
      }
      // half rows are widened into these; f32 and f64 rows are used in place
      const size_t buf_len = std::is_same_v<A, T> ? 0 : size_t(len);
      std::vector<A> in_buf(buf_len), out_buf(buf_len);
      int64_t r = rb;
      if constexpr (std::is_same_v<A, float>) {
        if (!log) {
          // kRowGroup rows at a time; a group gives each row the bits it gets alone
          std::vector<float> group_in[kRowGroup], group_out[kRowGroup];
          for (int k = 0; k < kRowGroup; ++k) group_in[k].resize(buf_len), group_out[k].resize(buf_len);
          for (; r + kRowGroup <= re; r += kRowGroup) {
            const float* xs[kRowGroup];
            float* ys[kRowGroup];
            for (int k = 0; k < kRowGroup; ++k) {
              xs[k] = as_acc<A>(x + (r + k) * len, len, group_in[k]);
              if constexpr (std::is_same_v<A, T>) {
                ys[k] = out + (r + k) * len;
              } else {
                ys[k] = group_out[k].data();
              }
            }
            softmax_rows<kRowGroup>(ys, xs, len, wide);
            if constexpr (!std::is_same_v<A, T>)
              for (int k = 0; k < kRowGroup; ++k) cpu::vec8::convert_row(out + (r + k) * len, ys[k], len);
          }
        }
      }
      for (; r < re; ++r) {
        const A* xr = as_acc<A>(x + r * len, len, in_buf);
        T* yr = out + r * len;
        if constexpr (std::is_same_v<A, T>) {
          softmax_row(yr, xr, len, log, wide);
        } else {
          softmax_row(out_buf.data(), xr, len, log, wide);
          cpu::vec8::convert_row(yr, out_buf.data(), len);
        }
      }
    });
    return;
  }
  // Softmax along a non-last dim: transpose a tile of columns into rows and back.
  const int64_t tiles = (inner + kColTile - 1) / kColTile;
  const int64_t grain = std::max<int64_t>(1, kGrainElems / (len * std::min(inner, kColTile)));
  parallel_for(0, g.outer * tiles, grain, [&](int64_t tb, int64_t te) {
    std::vector<A> tile(static_cast<size_t>(kColTile * len));
    for (int64_t t = tb; t < te; ++t) {
      const int64_t o = t / tiles, c0 = (t % tiles) * kColTile;
      const int64_t w = std::min(kColTile, inner - c0);
      const T* xb = x + o * len * inner + c0;
      T* yb = out + o * len * inner + c0;
      for (int64_t r = 0; r < len; ++r)
        for (int64_t j = 0; j < w; ++j) tile[size_t(j * len + r)] = A(xb[r * inner + j]);
      for (int64_t j = 0; j < w; ++j) softmax_row(tile.data() + j * len, tile.data() + j * len, len, log, wide);
      for (int64_t r = 0; r < len; ++r)
        for (int64_t j = 0; j < w; ++j) yb[r * inner + j] = T(tile[size_t(j * len + r)]);
    }
  });
}

void softmax_cpu(const Tensor& out, const Tensor& x, const SoftmaxGeometry& g, bool log) {
  visit_floating(x.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_forward(out.data_ptr<T>(), x.data_ptr<T>(), g, log);
  });
}

template <typename T>
void softmax_backward(T* dx, const T* gy, const T* y, const SoftmaxGeometry& g, bool log) {
  using A = acc_t<T>;
  const int64_t len = g.len, inner = g.inner;
  const bool wide = cpu::wide_rows();
  if (inner == 1) {
    const int64_t grain = std::max<int64_t>(1, kGrainElems / len);
    parallel_for(0, g.outer, grain, [&](int64_t rb, int64_t re) {
      std::vector<A> g_buf(static_cast<size_t>(len)), y_buf(static_cast<size_t>(len)), out_buf(static_cast<size_t>(len));
      for (int64_t r = rb; r < re; ++r) {
        const A* gr = as_acc<A>(gy + r * len, len, g_buf);
        const A* yr = as_acc<A>(y + r * len, len, y_buf);
        T* dr = dx + r * len;
        if constexpr (std::is_same_v<A, T>) {
          softmax_backward_row(dr, gr, yr, len, log, wide);
        } else {
          softmax_backward_row(out_buf.data(), gr, yr, len, log, wide);
          cpu::vec8::convert_row(dr, out_buf.data(), len);
        }
      }
    });
    return;
  }
  const int64_t tiles = (inner + kColTile - 1) / kColTile;
  const int64_t grain = std::max<int64_t>(1, kGrainElems / (len * std::min(inner, kColTile)));
  parallel_for(0, g.outer * tiles, grain, [&](int64_t tb, int64_t te) {
    std::vector<A> g_tile(static_cast<size_t>(kColTile * len)), y_tile(static_cast<size_t>(kColTile * len));
    for (int64_t t = tb; t < te; ++t) {
      const int64_t o = t / tiles, c0 = (t % tiles) * kColTile;
      const int64_t w = std::min(kColTile, inner - c0);
      const int64_t base = o * len * inner + c0;
      for (int64_t r = 0; r < len; ++r)
        for (int64_t j = 0; j < w; ++j) {
          g_tile[size_t(j * len + r)] = A(gy[base + r * inner + j]);
          y_tile[size_t(j * len + r)] = A(y[base + r * inner + j]);
        }
      for (int64_t j = 0; j < w; ++j)
        softmax_backward_row(g_tile.data() + j * len, g_tile.data() + j * len, y_tile.data() + j * len, len, log,
                             wide);
      for (int64_t r = 0; r < len; ++r)
        for (int64_t j = 0; j < w; ++j) dx[base + r * inner + j] = T(g_tile[size_t(j * len + r)]);
    }
  });
}

void softmax_backward_cpu(const Tensor& grad_in, const Tensor& grad_out, const Tensor& y, const SoftmaxGeometry& g,
                          bool log) {
  visit_floating(y.dtype(), log ? "log_softmax_backward" : "softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_backward(grad_in.data_ptr<T>(), grad_out.data_ptr<T>(), y.data_ptr<T>(), g, log);
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::softmax_stub, CPU, &softmax_cpu);
EMBER_REGISTER_KERNEL(native::softmax_backward_stub, CPU, &softmax_backward_cpu);

}  // namespace ember
