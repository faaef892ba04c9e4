// The 2x2 stride-2 f32 average pool and its backward, eight outputs at a time from two input
// rows, each written in one pass.
//
// Bits: the general kernel (kernels/cpu/pooling.cpp) sums each window's column pairs from zero,
// (0 + x00) + x10 and so on, adds the two columns to a zero, and divides by 4. Without the zeros
// the sum is the same except that it may be -0 where theirs is +0, so one + 0 at the end makes
// it identical; dividing by 4 and multiplying by 0.25 round alike (an exact power of two). The
// backward's share is grad_out * 0.25 + 0 for the same reason, and positions no window covers
// (the last row or column of odd sizes) are +0.
//
// The windows do not overlap, so the backward writes grad_in once, with no zero fill and no
// accumulation. A row of at least eight outputs ends with a step that overlaps the one before it
// (recomputing the same values), so no step is partial; narrower rows go one output at a time.
#include "kernels/cpu/avg_pool_2x2.h"

#include <algorithm>

#include "core/parallel.h"
#include "kernels/cpu/pool_plane_grain.h"
#include "kernels/cpu/vec8.h"

namespace ember::cpu {
namespace {

using vec8::f8;

// Outputs [ow, ow + 8) of the row pair r0, r1.
EMBER_LANES_INLINE void forward_step(float* o, const float* r0, const float* r1, int64_t ow) {
  const f8 lo = vec8::load8(r0 + 2 * ow) + vec8::load8(r1 + 2 * ow);  // column sums
  const f8 hi = vec8::load8(r0 + 2 * ow + 8) + vec8::load8(r1 + 2 * ow + 8);
  const f8 even = __builtin_shufflevector(lo, hi, 0, 2, 4, 6, 8, 10, 12, 14);
  const f8 odd = __builtin_shufflevector(lo, hi, 1, 3, 5, 7, 9, 11, 13, 15);
  vec8::store8(o + ow, (even + odd + 0.0f) * 0.25f);
}

float forward_one(const float* r0, const float* r1, int64_t ow) {
  return ((r0[2 * ow] + r1[2 * ow]) + (r0[2 * ow + 1] + r1[2 * ow + 1]) + 0.0f) * 0.25f;
}

// Inputs of outputs [ow, ow + 8) in the row pair d0, d1.
EMBER_LANES_INLINE void backward_step(float* d0, float* d1, const float* go, int64_t ow) {
  const f8 s = vec8::load8(go + ow) * 0.25f + 0.0f;
  const f8 lo = __builtin_shufflevector(s, s, 0, 0, 1, 1, 2, 2, 3, 3);
  const f8 hi = __builtin_shufflevector(s, s, 4, 4, 5, 5, 6, 6, 7, 7);
  vec8::store8(d0 + 2 * ow, lo);
  vec8::store8(d0 + 2 * ow + 8, hi);
  vec8::store8(d1 + 2 * ow, lo);
  vec8::store8(d1 + 2 * ow + 8, hi);
}

void forward_plane(float* out, const float* x, const native::Pool2dGeometry& g) {
  const int64_t w = g.in_w, ow_n = g.out_w;
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    const float* r0 = x + 2 * oh * w;
    float* o = out + oh * ow_n;
    if (ow_n >= 8) {
      int64_t ow = 0;
      for (; ow + 8 <= ow_n; ow += 8) forward_step(o, r0, r0 + w, ow);
      if (ow < ow_n) forward_step(o, r0, r0 + w, ow_n - 8);
    } else {
      for (int64_t ow = 0; ow < ow_n; ++ow) o[ow] = forward_one(r0, r0 + w, ow);
    }
  }
}

void backward_plane(float* gi, const float* go, const native::Pool2dGeometry& g) {
  const int64_t w = g.in_w, ow_n = g.out_w;
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    float* d0 = gi + 2 * oh * w;
    float* d1 = d0 + w;
    const float* grow = go + oh * ow_n;
    if (ow_n >= 8) {
      int64_t ow = 0;
      for (; ow + 8 <= ow_n; ow += 8) backward_step(d0, d1, grow, ow);
      if (ow < ow_n) backward_step(d0, d1, grow, ow_n - 8);
    } else {
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        const float s = grow[ow] * 0.25f + 0.0f;
        d0[2 * ow] = d0[2 * ow + 1] = d1[2 * ow] = d1[2 * ow + 1] = s;
      }
    }
    std::fill(d0 + 2 * ow_n, d0 + w, 0.0f);  // columns no window covers
    std::fill(d1 + 2 * ow_n, d1 + w, 0.0f);
  }
  std::fill(gi + 2 * g.out_h * w, gi + g.in_h * w, 0.0f);  // rows no window covers
}

}  // namespace

bool is_plain_avg_2x2(const native::Pool2dGeometry& g) {
  // adaptive windows are [2o, 2o + 2) exactly when the input is twice the output
  if (g.adaptive) return g.in_h == 2 * g.out_h && g.in_w == 2 * g.out_w;
  return g.kernel_h == 2 && g.kernel_w == 2 && g.stride_h == 2 && g.stride_w == 2 && g.pad_h == 0 && g.pad_w == 0 &&
         2 * g.out_h <= g.in_h && 2 * g.out_w <= g.in_w;
}

void avg_pool_2x2_forward(float* out, const float* x, const native::Pool2dGeometry& g) {
  const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
  parallel_for(0, g.planes, pool_plane_grain(g), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) forward_plane(out + p * out_plane, x + p * in_plane, g);
  });
}

void avg_pool_2x2_backward(float* grad_in, const float* grad_out, const native::Pool2dGeometry& g) {
  const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
  parallel_for(0, g.planes, pool_plane_grain(g), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) backward_plane(grad_in + p * in_plane, grad_out + p * out_plane, g);
  });
}

}  // namespace ember::cpu
