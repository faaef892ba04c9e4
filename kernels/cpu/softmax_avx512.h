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
};

}  // namespace ember::cpu
