// Ember's own cache-blocked ("packed", BLIS-style) GEMM on f32 and bf16 operands.
//
//   C = alpha * op(A) * op(B) + beta * C,   op(A) is m x k, op(B) is k x n, C is m x n row-major,
//
// with the contract of cpu::gemm (gemm.h): CBLAS row-major trans flags and strides (trans_a
// reads A stored k x m with row stride lda, likewise B), transposed operands read in place,
// beta == 0 overwrites C without reading it (it may hold NaN garbage), k == 0 or alpha == 0
// leaves C = beta * C. alpha and beta are f32 whatever the element types.
//
// A and B are each float or BFloat16; C is float or BFloat16. Blocks of A and B are packed
// into per-thread f32 panels as they are used (a bf16 value widens exactly: its bits shifted
// left by 16), so no operand is ever converted whole. Products accumulate in f32 registers.
// A bf16 C is formed in f32 (alpha * AB + beta * C, C widened) and rounded into C exactly
// once, to nearest even like BFloat16(float); when k spans several blocks the partial sums
// wait in a per-thread f32 staging block.
//
// bias (optional, n values of C's type): added to every row of C in the epilogue, with the bits
// of seeding every row of C with it and running beta = 1 (c = fma(1, bias, alpha * acc)), but
// without a pass over C to seed it. beta must then be 0.
//
// Summation order (ranks of data-parallel training compare results bit for bit): every entry
// of C is computed by the same arithmetic wherever it lands:
//   acc = 0; for p in the chunk, in order: acc = fma(a[i][p], b[p][j], acc)
//   first chunk:  c = alpha * acc, then c = fma(beta, c_old, c) when beta != 0
//   later chunks: c = fma(1, c_old, alpha * acc)
// The inner dimension is cut into chunks that depend on k alone (kPackedKc), taken in order.
// Edge tiles run the same micro-kernel on zero-padded panels into a scratch tile, so the
// result does not depend on the band, block or tile an entry falls in, hence not on the
// thread count either. Both micro-kernels share the chunking and the arithmetic above, so the
// AVX2 and AVX-512 kernels give the same bits too.
//
// Memory: packing buffers and the bf16 staging block are thread_local and grow to the
// largest product seen (bounded by the block sizes, a few MiB per thread); a steady state
// allocates nothing. They are not kernels/cpu/scratch.h's slots, so this GEMM may run inside
// code that holds those.
#pragma once
#include <cstdint>

#include "core/half.h"

namespace ember::cpu {

enum class PackedKernel { Avx2, Avx512 };

const char* packed_kernel_name(PackedKernel kernel);
// Whether this CPU, under the current EMBER_CPU_CAPABILITY, can run the kernel.
bool packed_kernel_available(PackedKernel kernel);
// Avx512 where cpu_capability() allows AVX-512 (EMBER_CPU_CAPABILITY=avx2 caps it), else Avx2.
PackedKernel packed_kernel_for_this_cpu();

// One thread: the whole product on the calling thread. Asking for a kernel the CPU cannot
// run is an ember::Error.
template <class TA, class TB, class TC>
void packed_gemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const TA* a,
                        int64_t lda, const TB* b, int64_t ldb, float beta, TC* c, int64_t ldc, PackedKernel kernel,
                        const TC* bias = nullptr);

// Threaded: C cut into bands, one per thread of Ember's pool (gemm_bands.h), each band run by
// packed_gemm_serial. Inside a parallel_for body it runs on the calling thread alone.
template <class TA, class TB, class TC>
void packed_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const TA* a, int64_t lda,
                 const TB* b, int64_t ldb, float beta, TC* c, int64_t ldc, PackedKernel kernel,
                 const TC* bias = nullptr);

#define EMBER_PACKED_GEMM_DECLARE(TA, TB, TC)                                                                      \
  extern template void packed_gemm_serial<TA, TB, TC>(bool, bool, int64_t, int64_t, int64_t, float, const TA*,      \
                                                      int64_t, const TB*, int64_t, float, TC*, int64_t,             \
                                                      PackedKernel, const TC*);                                    \
  extern template void packed_gemm<TA, TB, TC>(bool, bool, int64_t, int64_t, int64_t, float, const TA*, int64_t,    \
                                               const TB*, int64_t, float, TC*, int64_t, PackedKernel, const TC*);
EMBER_PACKED_GEMM_DECLARE(float, float, float)
EMBER_PACKED_GEMM_DECLARE(BFloat16, BFloat16, BFloat16)
EMBER_PACKED_GEMM_DECLARE(BFloat16, BFloat16, float)
#undef EMBER_PACKED_GEMM_DECLARE

// C = beta * C (m x n, row stride ldc): all of a product whose k is 0 or alpha 0. beta == 0
// writes zeros without reading C (it may hold NaN garbage).
template <class TC>
void scale_by_beta(int64_t m, int64_t n, float beta, TC* c, int64_t ldc) {
  if (beta == 1.0f) return;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      TC& v = c[i * ldc + j];
      v = TC(beta == 0.0f ? 0.0f : beta * float(v));
    }
}

// Every row of C (m x n, row stride ldc) set to bias [n]: the seed of a bias product on the
// paths that add it as beta * C rather than in their epilogue.
template <class TC>
void seed_rows_with_bias(int64_t m, int64_t n, const TC* bias, TC* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = bias[j];
}

// ---- the micro-kernels (gemm_packed_avx2.cpp, gemm_packed_avx512.cpp), for gemm_packed.cpp
//
// A register tile of kRows x kCols entries of C:
//   acc[i][j] = sum over p < kc, in order, of a[p * kRows + i] * b[p * kCols + j]   (fma chain)
//   c[i * ldc + j] = alpha * acc[i][j], then fma(beta, old c, that) unless beta == 0
// a is a packed row panel (kc steps of kRows values), b a packed column panel (kc steps of
// kCols values, 64-byte aligned). beta == 0 never reads c.
using PackedMicroKernel = void (*)(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha,
                                   float beta);

inline constexpr int kPackedAvx2Rows = 6;     // 12 ymm accumulators, 2 B vectors, 1 broadcast
inline constexpr int kPackedAvx2Cols = 16;
inline constexpr int kPackedAvx512Rows = 12;  // 24 zmm accumulators, 2 B vectors, broadcasts
inline constexpr int kPackedAvx512Cols = 32;
// f32 products at most this wide, on the AVX-512 kernel, read A in place rather than packing it
// (in_place_a_micro_kernel_avx512), and an untransposed B too when its column panels are whole:
// a packed A block serves n / 32 column panels, too few here to repay its packing.
inline constexpr int64_t kInPlaceMaxN = 128;

void packed_micro_kernel_avx2(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha,
                              float beta);
// The same tile starting from a bias row instead of C: c = fma(1, bias[j], alpha * acc), C not
// read; the bits of a C seeded with the bias and run with beta = 1, without the seeding.
void packed_bias_micro_kernel_avx2(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha,
                                   const float* bias);
// The same tile with B read in place: b[p * ldb + j] for j < kPackedAvx2Cols, any alignment
// (a row-major operand whose rows need no packing, such as a convolution's dY).
void strided_b_micro_kernel_avx2(int64_t kc, const float* a, const float* b, int64_t ldb, float* c, int64_t ldc,
                                 float alpha, float beta);
// AVX-512F code: call only where packed_kernel_available(PackedKernel::Avx512).
void packed_micro_kernel_avx512(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha,
                                float beta);
// The AVX-512 tile starting from a bias row, as packed_bias_micro_kernel_avx2.
void packed_bias_micro_kernel_avx512(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha,
                                     const float* bias);
// The AVX-512 tile with B read in place, as strided_b_micro_kernel_avx2.
void strided_b_micro_kernel_avx512(int64_t kc, const float* a, const float* b, int64_t ldb, float* c, int64_t ldc,
                                   float alpha, float beta);
// That tile's C written past the cache with non-temporal stores, for a C larger than the caches
// that is not read back soon: c 64-byte aligned, ldc a multiple of 16, beta 0 (not read). The
// caller fences (_mm_sfence) before another thread reads C.
void streamed_b_micro_kernel_avx512(int64_t kc, const float* a, const float* b, int64_t ldb, float* c, int64_t ldc,
                                    float alpha, float beta);
// The AVX-512 tile with A read in place instead of from a packed panel: row i of op(A) at
// a[i * lda + p] (a_transposed: a[p * lda + i], A stored k x m). B is a packed panel (ldb 0) or
// B's rows read in place, ldb apart. Only the tile's first `rows` rows are computed, read or
// written (in_place_a_rows_supported: 4, 8 or all 12; any other count computes nothing and
// returns false). For products too small for packing to pay for itself; the values are the
// packed tile's, bit for bit.
bool in_place_a_micro_kernel_avx512(int64_t kc, const float* a, int64_t lda, bool a_transposed, const float* b,
                                    int64_t ldb, float* c, int64_t ldc, float alpha, float beta, int rows);
inline constexpr bool in_place_a_rows_supported(int rows) { return rows == 4 || rows == 8 || rows == kPackedAvx512Rows; }
// The first kRows rows of the strided and streamed tiles (a still kPackedAvx512Rows values a step,
// the rest of C's tile neither read nor written), for a last row panel with that few rows: the full
// tile spent a third or two thirds of its multiplies on zero rows there. The same values row for
// row.
// kRows 4 or 8; kStream: C written past the cache, as streamed_b_micro_kernel_avx512.
template <int kRows, bool kStream>
void part_b_micro_kernel_avx512(int64_t kc, const float* a, const float* b, int64_t ldb, float* c, int64_t ldc,
                                float alpha, float beta);

}  // namespace ember::cpu
