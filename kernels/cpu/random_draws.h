// The scalar definitions of the CPU random fills: the value element i gets from its Philox draw
// (kernels/cpu/random.cpp), shared with the AVX2 fills (kernels/cpu/random_lanes.cpp), which must
// give the same bits.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>

#include "core/rng.h"

namespace ember::cpu {

// Box-Muller on two uniforms from one Philox draw; u1 is kept away from 0.
inline double normal_from(const std::array<uint32_t, 4>& r) {
  const double u1 = (double(r[0] >> 8) + 1.0) / 16777217.0;
  const double u2 = double(r[1] >> 8) / 16777216.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// mean + std * normal, with an explicit fma: the CUDA kernel computes the same.
inline double normal_value(const std::array<uint32_t, 4>& r, double mean, double std) {
  return std::fma(std, normal_from(r), mean);
}

// A uniform in [a, b) for types narrower than double: 24 random bits are exact in every float
// type, so the result stays below b after rounding. Explicit fma so CPU and CUDA round alike.
inline double uniform_value(const std::array<uint32_t, 4>& r, double a, double b) {
  return std::fma(b - a, double(Philox::to_uniform(r[0])), a);
}

}  // namespace ember::cpu
