// CPU 2-D max and average pooling and their backward (core/native/pooling.h).
//
// Threads take whole planes (N * C of them), so no two threads touch one plane and the
// backward's overlapping windows can be summed without atomics, in a fixed order. Inside a plane
// the work runs along rows: the max pool keeps a row of running maxima and sweeps each kernel
// position across it; the average pool is separable, summing the window's input rows into one
// row of column sums and then each window's columns, so the inner loops are unit-stride and the
// compiler vectorises them. Half types compute in float. The 2x2 stride-2 f32 max and average
// pools of CNNs and the global average pool of ResNets have kernels of their own, forward and
// backward (kernels/cpu/max_pool_2x2.cpp, avg_pool_2x2.cpp, global_avg_pool.cpp).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/native/pooling.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/avg_pool_2x2.h"
#include "kernels/cpu/global_avg_pool.h"
#include "kernels/cpu/max_pool_2x2.h"
#include "kernels/cpu/pool_plane_grain.h"
#include "kernels/shared/pooling_window.h"

namespace ember {
namespace {

using cpu::pool_plane_grain;
using kernels::avg_window;
using kernels::pool_dim_h;
using kernels::pool_dim_w;
using kernels::PoolDim;
using native::Pool2dGeometry;

// The outputs o of dim `d` whose input o * stride + offset lies in [0, in).
std::pair<int64_t, int64_t> outputs_inside(const PoolDim& d, int64_t offset) {
  const int64_t lo = offset >= 0 ? 0 : (-offset + d.stride - 1) / d.stride;
  const int64_t hi = std::min(d.out, d.in - offset <= 0 ? 0 : (d.in - offset + d.stride - 1) / d.stride);
  return {lo, std::max(lo, hi)};
}

// One kernel position across a row of outputs: output ow compares row[ow * stride + offset].
// PyTorch's rule: a strictly greater value or any NaN takes the window. Written as selects on
// restrict pointers so it compiles without branches (random data would mispredict half of them)
// and the compiler may vectorise it.
template <typename T, typename A>
void sweep_max(A* __restrict best, int64_t* __restrict arg, const T* __restrict row, int64_t row_start,
               int64_t offset, int64_t stride, int64_t lo, int64_t hi) {
  for (int64_t ow = lo; ow < hi; ++ow) {
    const int64_t iw = ow * stride + offset;
    const A v = A(row[iw]), b = best[ow];
    const bool take = (v > b) | (v != v);
    best[ow] = take ? v : b;
    arg[ow] = take ? row_start + iw : arg[ow];
  }
}

template <typename T>
void max_pool_planes(T* out, int64_t* indices, const T* x, const Pool2dGeometry& g) {
  using A = acc_t<T>;
  const PoolDim dh = pool_dim_h(g), dw = pool_dim_w(g);
  const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
  // the same for every row: each kernel column's outputs inside the input, each window's first column
  std::vector<std::pair<int64_t, int64_t>> inside(static_cast<size_t>(g.kernel_w));
  for (int64_t kw = 0; kw < g.kernel_w; ++kw) inside[size_t(kw)] = outputs_inside(dw, kw * g.dilation_w - g.pad_w);
  std::vector<int64_t> first_col(static_cast<size_t>(g.out_w));
  for (int64_t ow = 0; ow < g.out_w; ++ow) first_col[size_t(ow)] = kernels::max_window_first(dw, ow);
  parallel_for(0, g.planes, pool_plane_grain(g), [&](int64_t begin, int64_t end) {
    std::vector<A> best(size_t(g.out_w));
    std::vector<int64_t> arg(size_t(g.out_w));
    for (int64_t p = begin; p < end; ++p) {
      const T* in = x + p * in_plane;
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        const int64_t first_row = kernels::max_window_first(dh, oh);
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          best[size_t(ow)] = -std::numeric_limits<A>::infinity();
          arg[size_t(ow)] = first_row * g.in_w + first_col[size_t(ow)];
        }
        for (int64_t kh = 0; kh < g.kernel_h; ++kh) {
          const int64_t ih = oh * g.stride_h - g.pad_h + kh * g.dilation_h;
          if (ih < 0 || ih >= g.in_h) continue;
          const T* row = in + ih * g.in_w;
          for (int64_t kw = 0; kw < g.kernel_w; ++kw)
            sweep_max(best.data(), arg.data(), row, ih * g.in_w, kw * g.dilation_w - g.pad_w, g.stride_w,
                      inside[size_t(kw)].first, inside[size_t(kw)].second);
        }
        T* o = out + p * out_plane + oh * g.out_w;
        int64_t* ix = indices + p * out_plane + oh * g.out_w;
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          o[ow] = T(best[size_t(ow)]);
          ix[ow] = arg[size_t(ow)];
        }
      }
    }
  });
}

// For each plane: acc (in_h * in_w, zeroed) gets fn(plane, acc, row)'s sums, then lands in
// grad_in's plane; row is scratch of in_w elements. f32 and f64 sum in grad_in itself, half
// types in a float plane rounded once at the end.
template <typename T, typename F>
void accumulate_planes(T* grad_in, const Pool2dGeometry& g, const F& fn) {
  using A = acc_t<T>;
  constexpr bool in_place = std::is_same_v<A, T>;
  const int64_t in_plane = g.in_h * g.in_w;
  parallel_for(0, g.planes, pool_plane_grain(g), [&](int64_t begin, int64_t end) {
    std::vector<A> buffer(in_place ? 0 : static_cast<size_t>(in_plane)), row(static_cast<size_t>(g.in_w));
    for (int64_t p = begin; p < end; ++p) {
      T* gi = grad_in + p * in_plane;
      A* acc = in_place ? reinterpret_cast<A*>(gi) : buffer.data();
      std::fill(acc, acc + in_plane, A(0));
      fn(p, acc, row.data());
      if constexpr (!in_place)
        for (int64_t i = 0; i < in_plane; ++i) gi[i] = T(acc[i]);
    }
  });
}

template <typename T>
void max_pool_backward_planes(T* grad_in, const T* grad_out, const int64_t* indices, const Pool2dGeometry& g) {
  using A = acc_t<T>;
  const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
  accumulate_planes(grad_in, g, [&](int64_t p, A* acc, A*) {
    const T* go = grad_out + p * out_plane;
    const int64_t* ix = indices + p * out_plane;
    for (int64_t o = 0; o < out_plane; ++o) {
      const int64_t i = ix[o];
      if (i >= 0 && i < in_plane) acc[i] += A(go[o]);
    }
  });
}

// The average windows of every output of one dim, the same for all planes (computed once: the
// adaptive ones take integer divisions).
std::vector<kernels::AvgWindow> avg_windows(const PoolDim& d, const Pool2dGeometry& g) {
  std::vector<kernels::AvgWindow> w(static_cast<size_t>(d.out));
  for (int64_t o = 0; o < d.out; ++o) w[size_t(o)] = avg_window(d, o, g.adaptive, g.count_include_pad);
  return w;
}

template <typename T>
void avg_pool_planes(T* out, const T* x, const Pool2dGeometry& g) {
  using A = acc_t<T>;
  const auto rows = avg_windows(pool_dim_h(g), g), cols = avg_windows(pool_dim_w(g), g);
  const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
  parallel_for(0, g.planes, pool_plane_grain(g), [&](int64_t begin, int64_t end) {
    std::vector<A> column_sums(size_t(g.in_w));
    A* cs = column_sums.data();
    for (int64_t p = begin; p < end; ++p) {
      const T* in = x + p * in_plane;
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        const auto& wh = rows[size_t(oh)];
        std::fill(column_sums.begin(), column_sums.end(), A(0));
        for (int64_t ih = wh.begin; ih < wh.end; ++ih) {
          const T* row = in + ih * g.in_w;
          for (int64_t iw = 0; iw < g.in_w; ++iw) cs[iw] += A(row[iw]);
        }
        T* o = out + p * out_plane + oh * g.out_w;
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          const auto& ww = cols[size_t(ow)];
          A s = 0;
          for (int64_t iw = ww.begin; iw < ww.end; ++iw) s += cs[iw];
          o[ow] = T(s / A(wh.count * ww.count));
        }
      }
    }
  });
}

// Whether no input row lies in two output rows' windows (stride >= kernel, or adaptive pooling
// to a divisor of the size): then each row of grad_in is written once.
bool rows_disjoint(const std::vector<kernels::AvgWindow>& rows) {
  for (size_t o = 1; o < rows.size(); ++o)
    if (rows[o].begin < rows[o - 1].end) return false;
  return true;
}

// One output row's shares spread over its input row: spread[iw] = 0 + each window's share that
// covers iw, windows in order.
template <typename T, typename A>
void spread_row(A* spread, const T* go, const kernels::AvgWindow& wh, const std::vector<kernels::AvgWindow>& cols,
                int64_t in_w) {
  std::fill(spread, spread + in_w, A(0));
  for (size_t ow = 0; ow < cols.size(); ++ow) {
    const auto& ww = cols[ow];
    const A share = A(go[ow]) / A(wh.count * ww.count);
    for (int64_t iw = ww.begin; iw < ww.end; ++iw) spread[iw] += share;
  }
}

template <typename T>
void avg_pool_backward_planes(T* grad_in, const T* grad_out, const Pool2dGeometry& g) {
  using A = acc_t<T>;
  const auto rows = avg_windows(pool_dim_h(g), g), cols = avg_windows(pool_dim_w(g), g);
  const int64_t out_plane = g.out_h * g.out_w;
  if (rows_disjoint(rows)) {
    // each row of grad_in is its window's spread row, or zero: 0 + spread in the general
    // order below, which is spread itself (spread starts from +0, so it is never -0)
    const int64_t in_plane = g.in_h * g.in_w;
    parallel_for(0, g.planes, pool_plane_grain(g), [&](int64_t begin, int64_t end) {
      std::vector<A> spread(static_cast<size_t>(g.in_w));
      for (int64_t p = begin; p < end; ++p) {
        T* gi = grad_in + p * in_plane;
        int64_t written = 0;  // rows of gi done
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          const auto& wh = rows[size_t(oh)];
          spread_row(spread.data(), grad_out + p * out_plane + oh * g.out_w, wh, cols, g.in_w);
          const int64_t first = std::clamp(wh.begin, written, g.in_h);  // windows in the padding are empty
          std::fill(gi + written * g.in_w, gi + first * g.in_w, T(0));
          for (int64_t ih = wh.begin; ih < wh.end; ++ih)
            std::transform(spread.begin(), spread.end(), gi + ih * g.in_w, [](A v) { return T(v); });
          written = std::max(first, wh.end);
        }
        std::fill(gi + written * g.in_w, gi + in_plane, T(0));
      }
    });
    return;
  }
  accumulate_planes(grad_in, g, [&](int64_t p, A* acc, A* spread) {
    // one row of the windows' shares, added to every input row the windows cover (separable)
    const T* go = grad_out + p * out_plane;
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      const auto& wh = rows[size_t(oh)];
      spread_row(spread, go + oh * g.out_w, wh, cols, g.in_w);
      for (int64_t ih = wh.begin; ih < wh.end; ++ih) {
        A* row = acc + ih * g.in_w;
        for (int64_t iw = 0; iw < g.in_w; ++iw) row[iw] += spread[iw];
      }
    }
  });
}

void max_pool2d_cpu(const Tensor& out, const Tensor& indices, const Tensor& x, const Pool2dGeometry& g) {
  visit_floating(x.dtype(), "max_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float>)
      if (cpu::is_plain_2x2(g))
        return cpu::max_pool_2x2_forward(out.data_ptr<float>(), indices.data_ptr<int64_t>(), x.data_ptr<float>(), g);
    max_pool_planes(out.data_ptr<T>(), indices.data_ptr<int64_t>(), x.data_ptr<T>(), g);
  });
}

void max_pool2d_backward_cpu(const Tensor& grad_in, const Tensor& grad_out, const Tensor& indices,
                             const Pool2dGeometry& g) {
  visit_floating(grad_in.dtype(), "max_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float>)
      if (cpu::is_plain_2x2(g))
        return cpu::max_pool_2x2_backward(grad_in.data_ptr<float>(), grad_out.data_ptr<float>(),
                                          indices.data_ptr<int64_t>(), g);
    max_pool_backward_planes(grad_in.data_ptr<T>(), grad_out.data_ptr<T>(), indices.data_ptr<int64_t>(), g);
  });
}

void avg_pool2d_cpu(const Tensor& out, const Tensor& x, const Pool2dGeometry& g) {
  visit_floating(x.dtype(), "avg_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float>) {
      if (cpu::is_plain_avg_2x2(g)) return cpu::avg_pool_2x2_forward(out.data_ptr<float>(), x.data_ptr<float>(), g);
      if (cpu::is_global_avg(g)) return cpu::global_avg_pool_forward(out.data_ptr<float>(), x.data_ptr<float>(), g);
    }
    avg_pool_planes(out.data_ptr<T>(), x.data_ptr<T>(), g);
  });
}

void avg_pool2d_backward_cpu(const Tensor& grad_in, const Tensor& grad_out, const Pool2dGeometry& g) {
  visit_floating(grad_in.dtype(), "avg_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float>) {
      if (cpu::is_plain_avg_2x2(g))
        return cpu::avg_pool_2x2_backward(grad_in.data_ptr<float>(), grad_out.data_ptr<float>(), g);
      if (cpu::is_global_avg(g))
        return cpu::global_avg_pool_backward(grad_in.data_ptr<float>(), grad_out.data_ptr<float>(), g);
    }
    avg_pool_backward_planes(grad_in.data_ptr<T>(), grad_out.data_ptr<T>(), g);
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::max_pool2d_stub, CPU, &max_pool2d_cpu);
EMBER_REGISTER_KERNEL(native::max_pool2d_backward_stub, CPU, &max_pool2d_backward_cpu);
EMBER_REGISTER_KERNEL(native::avg_pool2d_stub, CPU, &avg_pool2d_cpu);
EMBER_REGISTER_KERNEL(native::avg_pool2d_backward_stub, CPU, &avg_pool2d_backward_cpu);

}  // namespace ember
