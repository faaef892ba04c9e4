// The global f32 average pool and its backward, each plane read or written in one pass.
//
// Bits: the general kernel (kernels/cpu/pooling.cpp) sums each column down the rows from zero,
// then the column sums left to right from zero, and divides by the plane's size; the forward
// keeps that order, with the column sums eight columns to a vector. A row narrower than eight
// (7x7 planes) is read as eight floats, the lanes past its end unused, except where that would
// read past the end of x. The backward's value, 0 + grad_out / size, fills the plane.
#include "kernels/cpu/global_avg_pool.h"

#include <algorithm>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/pool_plane_grain.h"
#include "kernels/cpu/vec8.h"

namespace ember::cpu {
namespace {

using vec8::f8;

// Eight floats at p, or the n (< 8) before `end` when eight would read past it.
EMBER_LANES_INLINE f8 load_within(const float* p, const float* end) {
  return end - p >= vec8::kLanes ? vec8::load8(p) : vec8::load_tail(p, end - p, 0.0f);
}

}  // namespace

bool is_global_avg(const native::Pool2dGeometry& g) {
  if (g.out_h != 1 || g.out_w != 1) return false;
  if (g.adaptive) return true;
  // one window over the whole plane, nothing padded: it divides by the plane's size
  return g.kernel_h == g.in_h && g.kernel_w == g.in_w && g.pad_h == 0 && g.pad_w == 0;
}

void global_avg_pool_forward(float* out, const float* x, const native::Pool2dGeometry& g) {
  const int64_t h = g.in_h, w = g.in_w, in_plane = h * w;
  const float count = float(in_plane);
  const float* x_end = x + g.planes * in_plane;
  parallel_for(0, g.planes, pool_plane_grain(g), [&](int64_t begin, int64_t end) {
    std::vector<float> column_sums(size_t(w + vec8::kLanes));
    float* cs = column_sums.data();
    for (int64_t p = begin; p < end; ++p) {
      const float* in = x + p * in_plane;
      for (int64_t iw = 0; iw < w; iw += vec8::kLanes) {
        f8 s = f8{} + load_within(in + iw, x_end);
        for (int64_t ih = 1; ih < h; ++ih) s += load_within(in + ih * w + iw, x_end);
        vec8::store8(cs + iw, s);
      }
      float s = 0.0f;
      for (int64_t iw = 0; iw < w; ++iw) s += cs[iw];
      out[p] = s / count;
    }
  });
}

void global_avg_pool_backward(float* grad_in, const float* grad_out, const native::Pool2dGeometry& g) {
  const int64_t in_plane = g.in_h * g.in_w;
  const float count = float(in_plane);
  parallel_for(0, g.planes, pool_plane_grain(g), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const float share = 0.0f + grad_out[p] / count;
      std::fill(grad_in + p * in_plane, grad_in + (p + 1) * in_plane, share);
    }
  });
}

}  // namespace ember::cpu
