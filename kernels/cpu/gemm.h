// The one CPU matrix-multiply entry point; every matmul, bmm and linear on the CPU ends here.
//
//   C = alpha * op(A) * op(B) + beta * C,   op(A) is m x k, op(B) is k x n, C is m x n row-major.
//
// As in CBLAS row-major calls: with trans_a false, A is stored m x k row-major with row stride
// lda; with trans_a true, A is stored k x m row-major (so op(A) = A^T reads it as a column-major
// m x k matrix) with row stride lda. Likewise for B. Transposed operands are read in place,
// never copied. beta == 0 overwrites C without reading it (C may hold garbage).
//
// f32 runs on Ember's packed GEMM (gemm_packed.h: AVX2 or AVX-512 micro-kernels chosen at run
// time), small products on oneDNN's sgemm (gemm_f32_path.h has the measured choice;
// EMBER_F32_GEMM=onednn|packed forces one); f64 on Eigen's GEMM; all single-threaded inside Ember. Large products are split into bands of
// C, one per thread of Ember's pool (ember::get_num_threads()); called from inside a
// parallel_for body it runs on the calling thread alone.
//
// bf16: A and B in bfloat16, products accumulated in f32, C in bf16 or f32 (alpha and beta are
// f32; a bf16 C is rounded once, after beta * C is added). Three paths (gemm_bf16.h): oneDNN's
// bf16 matmul (AMX kernels) when the CPU has AMX and EMBER_CPU_CAPABILITY allows AVX-512;
// Ember's own AVX512-BF16 (vdpbf16ps) kernel for tiny products, and on CPUs without AMX whose
// cores run vdpbf16ps at least as fast as f32 FMAs; otherwise the operands are widened to f32
// as the packed GEMM packs them. EMBER_BF16_GEMM=onednn|avx512bf16|widened forces one.
#pragma once
#include <cstdint>

#include "core/half.h"

namespace ember::cpu {

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

extern template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                                 const float*, int64_t, float, float*, int64_t);
extern template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                                  const double*, int64_t, double, double*, int64_t);

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const BFloat16* a, int64_t lda,
          const BFloat16* b, int64_t ldb, float beta, BFloat16* c, int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const BFloat16* a, int64_t lda,
          const BFloat16* b, int64_t ldb, float beta, float* c, int64_t ldc);

// C = op(A) op(B) + bias, bias [n] (C's type) added to every row: the bits of seeding each row
// of C with the bias and calling gemm with alpha = 1 and beta = 1. Where the packed GEMM runs
// (f32 on AVX2 CPUs, bf16 on the widened path) the bias enters in its epilogue and C is
// written once; the other paths seed C first.
void gemm_bias(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
               const float* b, int64_t ldb, const float* bias, float* c, int64_t ldc);
void gemm_bias(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const BFloat16* a, int64_t lda,
               const BFloat16* b, int64_t ldb, const BFloat16* bias, BFloat16* c, int64_t ldc);

}  // namespace ember::cpu
