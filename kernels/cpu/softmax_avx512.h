// The softmax row code of kernels/cpu/softmax_rows.h and fused_softmax_rows.h on 16 float lanes
// (AVX-512), bit for bit the same results: each element takes the same steps, and every sum and
// maximum folds its lanes in the same order as the 8-lane code (softmax_avx512.cpp says how).
// The exps set the pace, so twice the lanes come close to twice the speed. Call only when
// cpu_capability() is CpuCapability::Avx512 (avx512f, bw, vl, dq).
#pragma once
#include <cstdint>

#include "core/half.h"

namespace ember::cpu {

// softmax_rows<R> of softmax_rows.h for R = rows, 1 to 3.
void softmax_rows_avx512(int rows, float* const* y, const float* const* x, int64_t n, float* m, float* inv);

// y = softmax(x) for `rows` rows of n, one after another (ld n; y may be x): the rows of
// softmax_rows, pipelined across groups of rows.
void softmax_row_run_avx512(float* y, const float* x, int64_t rows, int64_t n);

// log_softmax of one row of n, and its backward (dx = g - exp(y) * sum g), as the 8-lane rows of
// kernels/cpu/normalization_softmax.cpp; y may be x, dx may be g.
void log_softmax_row_avx512(float* y, const float* x, int64_t n);
void log_softmax_backward_row_avx512(float* dx, const float* g, const float* y, int64_t n);

// The rows of the scaled masked softmax (fused_softmax_rows.h) for x of type T: float, BFloat16
// or Half, the types softmax_avx512.cpp instantiates.
template <typename T>
struct ScaledMaskedSoftmaxAvx512 {
  // scaled_masked_softmax_rows<R, T> and scaled_masked_softmax_rows_again<R, T> for one group of
  // R = rows rows, 1 or 2.
  static void group(int rows, float* const* y, const T* const* x, const float* const* mask, float scale, int64_t n,
                    float* st);
  static void group_again(int rows, float* const* y, const T* const* x, const float* const* mask, float scale,
                          int64_t n, const float* st);
  // scaled_masked_softmax_rows for `rows` rows (y[r], x[r], mask[r] for r < rows; st gets 2 * rows
  // statistics), pipelined across groups of rows as softmax_row_run_avx512.
  static void run(int64_t rows, float* const* y, const T* const* x, const float* const* mask, float scale, int64_t n,
                  float* st);
  // The backward of `rows` rows: dx[r] = out_scale * (p * (g[r] - sum g[r] * p)), p the
  // probabilities group_again recomputes from the statistics st, the same bits as
  // scaled_masked_softmax_backward_cpu's 8-lane rows (fused_softmax.cpp) give in float. dx[r]
  // holds p on the way, so it must not be g[r].
  static void backward_run(int64_t rows, float* const* dx, const T* const* x, const float* const* mask,
                           const float* const* g, float scale, float out_scale, int64_t n, const float* st);
};

}  // namespace ember::cpu
