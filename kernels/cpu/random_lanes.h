// AVX2 fills of float32 random values, bit for bit the scalar ones of kernels/cpu/random_draws.h:
// out[i] = float(value of Philox::draw(st.seed, 0, st.offset + first + i)) for i < n. Built
// where the compiler targets AVX2 (__AVX2__, the x86-64-v3 baseline).
#pragma once
#include <cstdint>

#include "core/rng.h"

namespace ember::cpu {

void normal_fill_f32(float* out, const GeneratorState& st, int64_t first, int64_t n, double mean, double std);
void uniform_fill_f32(float* out, const GeneratorState& st, int64_t first, int64_t n, double a, double b);

}  // namespace ember::cpu
