// The packed GEMM's AVX-512F micro-kernel (see gemm_packed.h): a 12 x 32 tile of C in 24 zmm
// accumulators. Each step of k loads two vectors of the packed B panel and, per row,
// broadcasts one value of the packed A panel into two FMAs: 24 FMAs against 14 loads, and 24
// independent chains cover the FMA latency (4 cycles) times two FMA pipes with room to spare.
// 14 x 32 (28 accumulators) would leave one register for the broadcast and none for
// prefetching B ahead; 12 x 32 is also the shape of BLIS's Skylake-X sgemm kernel (32 x 12 in
// its column-major terms).
//
// The arithmetic is the AVX2 kernel's, lane for lane, so its results are bitwise those of the
// AVX2 kernel (tests/ops/test_gemm_packed.cpp checks it where AVX-512 exists).
//
// Measured on an Intel Xeon (family 6 model 207; FMA peak 177 GFLOP/s per core): the kernel
// alone, its panels in L1 and L2, runs at 187-190 GFLOP/s (above the peak machine_limits'
// dependent FMA chains reach); inside the packed GEMM at 134-155 (0.76-0.88 of the peak). A
// kernel writing to a scratch tile instead of C reaches 158-175 on the same shapes: what is
// lost is mostly C's traffic beyond L2 (a C of 2048 x 3072 f32 is read and written once per
// chunk of k). Spreading the C tile's prefetches over the loop instead of issuing them at its
// start, and prefetching for writing (prefetchw), changed nothing measurable.

#include <immintrin.h>

#include "kernels/cpu/gemm_packed.h"

// AVX-512 code, reached only after a run-time check (packed_kernel_available); everything
// below is compiled for it and nothing here is inline in a header another file could pick up.
#include "kernels/cpu/avx512_code_begin.inc"

namespace ember::cpu {
namespace {

// Where the tile's A values come from: a packed row panel (kPackedAvx512Rows values a step), or
// A read in place with row i of op(A) at a + i * lda (kRowsInPlace) or, for a transposed A, at
// a + i with the next step lda further on (kColumnsInPlace).
enum class ASource { kPanel, kRowsInPlace, kColumnsInPlace };

// The tile with B's rows ldb floats apart: the packed panel (ldb = kCols, aligned) or rows of a
// row-major matrix read in place (unaligned). kStream: C's rows written with non-temporal
// stores, nothing of C read or asked for beforehand (beta taken as 0).
// kRows: the tile's first rows computed (a still kPackedAvx512Rows values a step).
template <bool kPanel, bool kStream = false, int kRows = kPackedAvx512Rows, ASource kA = ASource::kPanel>
// bias (or null): c = fma(1, bias, alpha * acc) for every row, C not read (beta ignored): the
// bits of a C seeded with the bias and run with beta = 1.
[[gnu::always_inline]] inline void tile_12x32(int64_t kc, const float* a, const float* b, int64_t ldb, float* c,
                                              int64_t ldc, float alpha, float beta, int64_t lda = 0,
                                              const float* bias = nullptr) {
  constexpr int kCols = kPackedAvx512Cols;
  static_assert(kCols == 32, "two zmm vectors a row");
  __m512 acc0[kRows], acc1[kRows];
#pragma GCC unroll 12
  for (int i = 0; i < kRows; ++i) acc0[i] = acc1[i] = _mm512_setzero_ps();
  // The C tile is read or written only after the loop; its lines (often out in L3 or memory
  // by then) arrive while the loop runs.
#pragma GCC unroll 12
  for (int i = 0; i < kRows && !kStream; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + kCols - 1), _MM_HINT_T0);
  }
#pragma GCC unroll 4
  for (int64_t p = 0; p < kc; ++p) {
    const __m512 b0 = kPanel ? _mm512_load_ps(b) : _mm512_loadu_ps(b);
    const __m512 b1 = kPanel ? _mm512_load_ps(b + 16) : _mm512_loadu_ps(b + 16);
#pragma GCC unroll 12
    for (int i = 0; i < kRows; ++i) {
      const __m512 ai = _mm512_set1_ps(kA == ASource::kRowsInPlace ? a[i * lda] : a[i]);
      acc0[i] = _mm512_fmadd_ps(ai, b0, acc0[i]);
      acc1[i] = _mm512_fmadd_ps(ai, b1, acc1[i]);
    }
    a += kA == ASource::kPanel ? kPackedAvx512Rows : kA == ASource::kRowsInPlace ? 1 : lda;
    b += kPanel ? kCols : ldb;
  }
  const __m512 va = _mm512_set1_ps(alpha);
  if (bias != nullptr && !kStream) {
    const __m512 one = _mm512_set1_ps(1.0f), bias0 = _mm512_loadu_ps(bias), bias1 = _mm512_loadu_ps(bias + 16);
#pragma GCC unroll 12
    for (int i = 0; i < kRows; ++i) {
      _mm512_storeu_ps(c + i * ldc, _mm512_fmadd_ps(one, bias0, _mm512_mul_ps(va, acc0[i])));
      _mm512_storeu_ps(c + i * ldc + 16, _mm512_fmadd_ps(one, bias1, _mm512_mul_ps(va, acc1[i])));
    }
  } else if (kStream) {
#pragma GCC unroll 12
    for (int i = 0; i < kRows; ++i) {
      _mm512_stream_ps(c + i * ldc, _mm512_mul_ps(va, acc0[i]));
      _mm512_stream_ps(c + i * ldc + 16, _mm512_mul_ps(va, acc1[i]));
    }
  } else if (beta == 0.0f) {
#pragma GCC unroll 12
    for (int i = 0; i < kRows; ++i) {
      _mm512_storeu_ps(c + i * ldc, _mm512_mul_ps(va, acc0[i]));
      _mm512_storeu_ps(c + i * ldc + 16, _mm512_mul_ps(va, acc1[i]));
    }
  } else {
    const __m512 vb = _mm512_set1_ps(beta);
#pragma GCC unroll 12
    for (int i = 0; i < kRows; ++i) {
      float* row = c + i * ldc;
      _mm512_storeu_ps(row, _mm512_fmadd_ps(vb, _mm512_loadu_ps(row), _mm512_mul_ps(va, acc0[i])));
      _mm512_storeu_ps(row + 16, _mm512_fmadd_ps(vb, _mm512_loadu_ps(row + 16), _mm512_mul_ps(va, acc1[i])));
    }
  }
}

}  // namespace

void packed_micro_kernel_avx512(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha,
                                float beta) {
  tile_12x32<true>(kc, a, b, kPackedAvx512Cols, c, ldc, alpha, beta);
}

void packed_bias_micro_kernel_avx512(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha,
                                     const float* bias) {
  tile_12x32<true>(kc, a, b, kPackedAvx512Cols, c, ldc, alpha, 0.0f, 0, bias);
}

void strided_b_micro_kernel_avx512(int64_t kc, const float* a, const float* b, int64_t ldb, float* c, int64_t ldc,
                                   float alpha, float beta) {
  tile_12x32<false>(kc, a, b, ldb, c, ldc, alpha, beta);
}

void streamed_b_micro_kernel_avx512(int64_t kc, const float* a, const float* b, int64_t ldb, float* c, int64_t ldc,
                                    float alpha, float beta) {
  tile_12x32<false, true>(kc, a, b, ldb, c, ldc, alpha, beta);
}

namespace {

template <int kRows, ASource kA, bool kPanel>
void in_place_a_tile(int64_t kc, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                     float alpha, float beta) {
  tile_12x32<kPanel, false, kRows, kA>(kc, a, b, kPanel ? kPackedAvx512Cols : ldb, c, ldc, alpha, beta, lda);
}

using InPlaceTile = void (*)(int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, float, float);

template <ASource kA, bool kPanel>
InPlaceTile in_place_tile_for(int rows) {
  switch (rows) {
    case 4: return &in_place_a_tile<4, kA, kPanel>;
    case 8: return &in_place_a_tile<8, kA, kPanel>;
    case kPackedAvx512Rows: return &in_place_a_tile<kPackedAvx512Rows, kA, kPanel>;
    default: return nullptr;
  }
}

}  // namespace

bool in_place_a_micro_kernel_avx512(int64_t kc, const float* a, int64_t lda, bool a_transposed, const float* b,
                                    int64_t ldb, float* c, int64_t ldc, float alpha, float beta, int rows) {
  const bool panel = ldb == 0;
  const InPlaceTile tile =
      a_transposed ? (panel ? in_place_tile_for<ASource::kColumnsInPlace, true>(rows)
                            : in_place_tile_for<ASource::kColumnsInPlace, false>(rows))
                   : (panel ? in_place_tile_for<ASource::kRowsInPlace, true>(rows)
                            : in_place_tile_for<ASource::kRowsInPlace, false>(rows));
  if (tile == nullptr) return false;
  tile(kc, a, lda, b, ldb, c, ldc, alpha, beta);
  return true;
}

template <int kRows, bool kStream>
void part_b_micro_kernel_avx512(int64_t kc, const float* a, const float* b, int64_t ldb, float* c, int64_t ldc,
                                float alpha, float beta) {
  tile_12x32<false, kStream, kRows>(kc, a, b, ldb, c, ldc, alpha, beta);
}
template void part_b_micro_kernel_avx512<4, false>(int64_t, const float*, const float*, int64_t, float*, int64_t,
                                                   float, float);
template void part_b_micro_kernel_avx512<8, false>(int64_t, const float*, const float*, int64_t, float*, int64_t,
                                                   float, float);
template void part_b_micro_kernel_avx512<4, true>(int64_t, const float*, const float*, int64_t, float*, int64_t,
                                                  float, float);
template void part_b_micro_kernel_avx512<8, true>(int64_t, const float*, const float*, int64_t, float*, int64_t,
                                                  float, float);

}  // namespace ember::cpu

#include "kernels/cpu/avx512_code_end.inc"
