// CPU RMS norm over contiguous rows, forward and backward, threaded over rows.
//
// Forward: one pass for the row's sum of squares (double lanes), one writing x * rstd * w.
// Backward: with xhat = x rstd, dx = rstd (dy w - xhat mean(dy w xhat)) = dy w rstd + x b, one
// pass for sum(dy w x) and one writing dx. dweight = sum over rows of dy xhat: rows are cut
// into fixed chunks, each adding into its own partial sums, then the chunks are added in order
// (results independent of the thread count).
// f32 rows of a multiple of 16 take the 16-lane twins of these loops where the CPU has AVX-512
// (kernels/cpu/rms_norm_rows_avx512.h): the same bits.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/cpu_features.h"
#include "core/native/normalization.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/normalization_lanes.h"
#include "kernels/cpu/rms_norm_rows_avx512.h"
#include "kernels/cpu/scratch.h"

namespace ember {
namespace {

namespace nl = cpu::norm_lanes;
using nl::f8;
using nl::kLanes;

constexpr int64_t kTaskElements = 16384;
constexpr int64_t kRowsPerChunk = 32;
constexpr int kSideBySide = 4;  // f32 rows whose sums run side by side (independent add chains)
static_assert(kSideBySide <= cpu::rms_norm_rows::kMaxRows);

// Whether f32 rows of `cols` take the 16-lane loops.
template <typename T>
bool wide_rows(int64_t cols) {
  return std::is_same_v<T, float> && cols % 16 == 0 && cpu_capability() == CpuCapability::Avx512;
}

void rms_norm_cpu(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& weight, int64_t rows,
                  int64_t cols, double eps) {
  visit_floating(x.dtype(), "rms_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* px = x.data_ptr<T>();
    T* py = y.data_ptr<T>();
    A* pr = rstd.data_ptr<A>();
    const A* w = nl::data_or_null<A>(weight);
    const bool wide = wide_rows<T>(cols);
    const auto finish_row = [&](int64_t r, double ss) {
      const A rs = A(1.0 / std::sqrt(ss / double(cols) + eps));
      pr[r] = rs;
      if constexpr (std::is_same_v<T, float>)
        if (wide) return cpu::rms_norm_rows::scale_row_avx512(py + r * cols, px + r * cols, cols, rs, w);
      nl::scale_weighted(py + r * cols, px + r * cols, cols, rs, w);
    };
    parallel_for(0, rows, std::max<int64_t>(1, kTaskElements / cols), [&](int64_t rb, int64_t re) {
      int64_t r = rb;
      if constexpr (std::is_same_v<T, float>)
        if (wide) {
          for (; r < re; r += kSideBySide) {
            const int group = int(std::min<int64_t>(kSideBySide, re - r));
            double ss[kSideBySide];
            cpu::rms_norm_rows::sum_squares_avx512(ss, px + r * cols, cols, group);
            for (int k = 0; k < group; ++k) finish_row(r + k, ss[k]);
          }
          return;
        }
      if constexpr (std::is_same_v<T, float>)
        for (; r + kSideBySide <= re; r += kSideBySide) {
          nl::Sums2 ss[kSideBySide];
          nl::adjacent_pair_sums<kSideBySide, false>(px + r * cols, px + r * cols, cols, ss);
          for (int k = 0; k < kSideBySide; ++k) finish_row(r + k, ss[k].b);
        }
      for (; r < re; ++r) finish_row(r, nl::run_pair_sums(px + r * cols, px + r * cols, cols).b);
    });
  });
}

// sum of dy * w * x over one row (w null: ones), in double.
template <typename T, typename A>
double row_dot(const T* dy, const T* x, const A* w, int64_t n) {
  if constexpr (std::is_same_v<T, double>) {
    double acc[4] = {};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
      for (int k = 0; k < 4; ++k) acc[k] += dy[i + k] * (w ? w[i + k] : 1.0) * x[i + k];
    for (; i < n; ++i) acc[0] += dy[i] * (w ? w[i] : 1.0) * x[i];
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
  } else {
    return nl::pair_sums(
               n,
               [&](int64_t i) {
                 const f8 v = nl::load(dy, i, n);
                 return w ? v * nl::load(w, i, n) : v;
               },
               [&](int64_t i) { return nl::load(x, i, n); })
        .b;
  }
}

// row_dot of kRuns adjacent f32 rows side by side (each row's adds in row_dot's order).
template <int kRuns>
void row_dots(const float* dy, const float* x, const float* w, int64_t n, nl::Sums2* out) {
  nl::pair_sums_side_by_side<kRuns, false>(
      n,
      [&](int r, int64_t i) {
        const f8 v = nl::load(dy + r * n, i, n);
        return w ? v * nl::load(w, i, n) : v;
      },
      [&](int r, int64_t i) { return nl::load(x + r * n, i, n); }, out);
}

// dx = dy * w * a + x * b; dw_part[j] += dy * x * a (either output may be null).
template <typename T, typename A>
void backward_row(T* dx, double* dw_part, const T* dy, const T* x, const A* w, int64_t n, A a, A b) {
  if constexpr (std::is_same_v<T, double>) {
    if (dx)
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * (w ? w[i] : 1.0) * a + x[i] * b;
    if (dw_part)
      for (int64_t i = 0; i < n; ++i) dw_part[i] += dy[i] * x[i] * a;
  } else {
    for (int64_t i = 0; i < n; i += kLanes) {
      const f8 g = nl::load(dy, i, n), xv = nl::load(x, i, n);
      if (dx) nl::store(dx, i, n, (w ? g * nl::load(w, i, n) : g) * a + xv * b);
      if (dw_part) nl::add_lanes(dw_part + i, g * xv * a, std::min<int64_t>(kLanes, n - i));
    }
  }
}

// backward_row of f32 rows [rb, re) on 16 lanes, kSideBySide rows at a time (dx null: dweight only).
void backward_wide_rows(float* dx, double* dw_part, const float* dy, const float* x, const float* rstd,
                        const float* w, int64_t rb, int64_t re, int64_t cols) {
  namespace rows = cpu::rms_norm_rows;
  for (int64_t r = rb; r < re; r += kSideBySide) {
    const int group = int(std::min<int64_t>(kSideBySide, re - r));
    const int64_t off = r * cols;
    double dots[kSideBySide] = {};
    if (dx) rows::weighted_dots_avx512(dots, dy + off, x + off, w, cols, group);
    float a[kSideBySide], b[kSideBySide];
    for (int j = 0; j < group; ++j) {
      const double rs = double(rstd[r + j]);
      a[j] = float(rs);
      b[j] = dx ? float(-rs * rs * rs * dots[j] / double(cols)) : 0.0f;
    }
    rows::backward_rows_avx512(dx ? dx + off : nullptr, dw_part, dy + off, x + off, w, cols, group, a, b);
  }
}

void rms_norm_backward_cpu(const Tensor& dx, const Tensor& dweight, const Tensor& dy, const Tensor& x,
                           const Tensor& rstd, const Tensor& weight, int64_t rows, int64_t cols) {
  visit_floating(x.dtype(), "rms_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* px = x.data_ptr<T>();
    const T* pg = dy.data_ptr<T>();
    T* pdx = dx.defined() ? dx.data_ptr<T>() : nullptr;
    const A* pr = rstd.data_ptr<A>();
    const A* w = nl::data_or_null<A>(weight);
    const bool wide = wide_rows<T>(cols);
    const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
    double* part = dweight.defined() ? cpu::thread_scratch<double>(0, size_t(chunks * cols)) : nullptr;
    parallel_for(0, chunks, 1, [&](int64_t kb, int64_t ke) {
      for (int64_t k = kb; k < ke; ++k) {
        // each chunk zeroes its own partial sums, on its own thread and just before using them
        if (part) std::fill(part + k * cols, part + (k + 1) * cols, 0.0);
        const auto finish_row = [&](int64_t r, double dot) {
          const int64_t off = r * cols;
          const double rs = double(pr[r]);
          // b = -rs^2 mean(dy w xhat) = -rs^3 sum(dy w x) / cols
          const double b = pdx ? -rs * rs * rs * dot / double(cols) : 0.0;
          backward_row(pdx ? pdx + off : nullptr, part ? part + k * cols : nullptr, pg + off, px + off, w, cols,
                       A(rs), A(b));
        };
        const int64_t end = std::min(rows, (k + 1) * kRowsPerChunk);
        int64_t r = k * kRowsPerChunk;
        if constexpr (std::is_same_v<T, float>)
          if (wide) {
            backward_wide_rows(pdx, part ? part + k * cols : nullptr, pg, px, pr, w, r, end, cols);
            continue;
          }
        if constexpr (std::is_same_v<T, float>)
          if (pdx)
            for (; r + kSideBySide <= end; r += kSideBySide) {
              nl::Sums2 dots[kSideBySide];
              row_dots<kSideBySide>(pg + r * cols, px + r * cols, w, cols, dots);
              for (int j = 0; j < kSideBySide; ++j) finish_row(r + j, dots[j].b);
            }
        for (; r < end; ++r) finish_row(r, pdx ? row_dot(pg + r * cols, px + r * cols, w, cols) : 0.0);
      }
    });
    if (!part) return;
    A* dw = dweight.data_ptr<A>();
    // per column the chunks add in order; columns side by side, so the adds vectorise
    constexpr int64_t kBlock = 256;
    parallel_for(0, cols, kBlock, [&](int64_t jb, int64_t je) {
      for (int64_t j0 = jb; j0 < je; j0 += kBlock) {
        double sums[kBlock] = {};
        const int64_t width = std::min(kBlock, je - j0);
        for (int64_t k = 0; k < chunks; ++k) {
          const double* pk = part + k * cols + j0;
          for (int64_t j = 0; j < width; ++j) sums[j] += pk[j];
        }
        for (int64_t j = 0; j < width; ++j) dw[j0 + j] = A(sums[j]);
      }
    });
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::rms_norm_stub, CPU, &rms_norm_cpu);
EMBER_REGISTER_KERNEL(native::rms_norm_backward_stub, CPU, &rms_norm_backward_cpu);

}  // namespace ember
