// The packed GEMM's AVX2 + FMA micro-kernel (see gemm_packed.h): a 6 x 16 tile of C in 12 ymm
// accumulators. Each step of k loads two vectors of the packed B panel and, per row, broadcasts
// one value of the packed A panel into two FMAs: 12 FMAs against 8 loads, and 12 independent
// chains cover the FMA latency (4 cycles on Zen 3 and on Intel cores since Skylake) times the
// two FMA pipes.
#include <immintrin.h>

#include "kernels/cpu/gemm_packed.h"

namespace ember::cpu {
namespace {

// The tile with B's rows ldb floats apart: the packed panel (ldb = kCols, aligned) or rows of a
// row-major matrix read in place (unaligned). bias (or null): c = fma(1, bias, alpha * acc) for
// every row, C not read (beta ignored): the bits of a C seeded with the bias and run with beta 1.
template <bool kPanel>
[[gnu::always_inline]] inline void tile_6x16(int64_t kc, const float* a, const float* b, int64_t ldb, float* c,
                                             int64_t ldc, float alpha, float beta, const float* bias = nullptr) {
  constexpr int kRows = kPackedAvx2Rows;
  constexpr int kCols = kPackedAvx2Cols;
  static_assert(kCols == 16, "two ymm vectors a row");
  __m256 acc0[kRows], acc1[kRows];
#pragma GCC unroll 6
  for (int i = 0; i < kRows; ++i) acc0[i] = acc1[i] = _mm256_setzero_ps();
  // The C tile is read or written only after the loop; its lines (often out in L3 or memory
  // by then) arrive while the loop runs.
#pragma GCC unroll 6
  for (int i = 0; i < kRows; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + kCols - 1), _MM_HINT_T0);
  }
#pragma GCC unroll 4
  for (int64_t p = 0; p < kc; ++p) {
    const __m256 b0 = kPanel ? _mm256_load_ps(b) : _mm256_loadu_ps(b);
    const __m256 b1 = kPanel ? _mm256_load_ps(b + 8) : _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
    for (int i = 0; i < kRows; ++i) {
      const __m256 ai = _mm256_broadcast_ss(a + i);
      acc0[i] = _mm256_fmadd_ps(ai, b0, acc0[i]);
      acc1[i] = _mm256_fmadd_ps(ai, b1, acc1[i]);
    }
    a += kRows;
    b += kPanel ? kCols : ldb;
  }
  const __m256 va = _mm256_set1_ps(alpha);
  if (bias != nullptr) {
    const __m256 one = _mm256_set1_ps(1.0f), bias0 = _mm256_loadu_ps(bias), bias1 = _mm256_loadu_ps(bias + 8);
#pragma GCC unroll 6
    for (int i = 0; i < kRows; ++i) {
      _mm256_storeu_ps(c + i * ldc, _mm256_fmadd_ps(one, bias0, _mm256_mul_ps(va, acc0[i])));
      _mm256_storeu_ps(c + i * ldc + 8, _mm256_fmadd_ps(one, bias1, _mm256_mul_ps(va, acc1[i])));
    }
  } else if (beta == 0.0f) {
#pragma GCC unroll 6
    for (int i = 0; i < kRows; ++i) {
      _mm256_storeu_ps(c + i * ldc, _mm256_mul_ps(va, acc0[i]));
      _mm256_storeu_ps(c + i * ldc + 8, _mm256_mul_ps(va, acc1[i]));
    }
  } else {
    const __m256 vb = _mm256_set1_ps(beta);
#pragma GCC unroll 6
    for (int i = 0; i < kRows; ++i) {
      float* row = c + i * ldc;
      _mm256_storeu_ps(row, _mm256_fmadd_ps(vb, _mm256_loadu_ps(row), _mm256_mul_ps(va, acc0[i])));
      _mm256_storeu_ps(row + 8, _mm256_fmadd_ps(vb, _mm256_loadu_ps(row + 8), _mm256_mul_ps(va, acc1[i])));
    }
  }
}

}  // namespace

void packed_micro_kernel_avx2(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha,
                              float beta) {
  tile_6x16<true>(kc, a, b, kPackedAvx2Cols, c, ldc, alpha, beta);
}

void packed_bias_micro_kernel_avx2(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha,
                                   const float* bias) {
  tile_6x16<true>(kc, a, b, kPackedAvx2Cols, c, ldc, alpha, 0.0f, bias);
}

void strided_b_micro_kernel_avx2(int64_t kc, const float* a, const float* b, int64_t ldb, float* c, int64_t ldc,
                                 float alpha, float beta) {
  tile_6x16<false>(kc, a, b, ldb, c, ldc, alpha, beta);
}

}  // namespace ember::cpu
