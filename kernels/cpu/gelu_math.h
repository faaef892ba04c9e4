// GELU (exact and tanh forms) on 8 float lanes, shared by the unary gelu kernels and the fused
// bias + GELU kernels so both round identically; the formulas are in kernels/cpu/gelu_lanes.inc
// (kernels/cpu/gelu_avx512.cpp runs the same ones on 16 lanes).
#pragma once
#include <bit>
#include <cmath>

#include "kernels/cpu/vec8.h"

namespace ember::cpu::vec8 {

EMBER_LANES_INLINE f8 min_lanes(float hi, f8 x) { return min_keep_nan(hi, x); }
EMBER_LANES_INLINE f8 max_lanes(float lo, f8 x) { return max_keep_nan(lo, x); }
EMBER_LANES_INLINE f8 abs_min_lanes(float hi, f8 x) {
  return min_keep_nan(hi, std::bit_cast<f8>(std::bit_cast<u8>(x) & 0x7fffffffu));
}

#include "kernels/cpu/gelu_lanes.inc"

EMBER_LANES_INLINE f8 gelu8(f8 x) { return gelu_lanes(x); }
EMBER_LANES_INLINE f8 gelu_grad8(f8 x) { return gelu_grad_lanes(x); }
EMBER_LANES_INLINE f8 gelu_tanh8(f8 x) { return gelu_tanh_lanes(x); }
EMBER_LANES_INLINE f8 gelu_tanh_grad8(f8 x) { return gelu_tanh_grad_lanes(x); }

}  // namespace ember::cpu::vec8
