// The GELU row loops on 16 float lanes (AVX-512), for f32 and bf16 data: the formulas of
// kernels/cpu/gelu_lanes.inc, the same as the 8-lane AVX2 loops, so results round identically
// whichever runs. About twice the throughput of the AVX2 loops on the exact form, which is
// compute-bound. Call only when cpu_capability() is CpuCapability::Avx512 (avx512f, bw, vl, dq).
#pragma once
#include <cstdint>

#include "core/half.h"

namespace ember::cpu {

// y[i] = gelu(x[i] + bias[i]) (bias may be null: plain gelu); y may alias x. stream: write y
// with non-temporal stores (kernels/cpu/streamed_output.h), fenced before returning.
void gelu_forward_row_avx512(float* y, const float* x, const float* bias, int64_t n, bool tanh_approx,
                             bool stream = false);
void gelu_forward_row_avx512(BFloat16* y, const BFloat16* x, const float* bias, int64_t n, bool tanh_approx);

// d[i] = g[i] * gelu'(x[i] + bias[i]) (bias may be null); d may alias g.
void gelu_backward_row_avx512(float* d, const float* g, const float* x, const float* bias, int64_t n, bool tanh_approx);
void gelu_backward_row_avx512(float* d, const BFloat16* g, const BFloat16* x, const float* bias, int64_t n,
                              bool tanh_approx);
void gelu_backward_row_avx512(BFloat16* d, const BFloat16* g, const BFloat16* x, const float* bias, int64_t n,
                              bool tanh_approx);

}  // namespace ember::cpu
