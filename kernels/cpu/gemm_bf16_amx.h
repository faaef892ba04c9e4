// Ember's own bf16 GEMM on AMX tiles: tdpbf16ps multiplies a 16 x 32 bf16 tile of A by a
// 32 x 16 tile of B (stored as 16 rows of k-pairs, the two values of each column's pair side by
// side) into a 16 x 16 f32 tile of C. Both operands are packed into such tiles, zero-padded at
// the edges, and a 2 x 2 block of C tiles is accumulated per step (gemm_bf16_amx_blocking.inc).
//
// Same contract as cpu::gemm (gemm.h) and gemm_bf16_avx512_serial, for one band of C on the
// calling thread: the caller splits the work across threads. The sum for every entry of C runs
// in the same order whatever the band's shape. tdpbf16ps treats bf16 subnormals as zero and
// flushes subnormal results; a bf16 C is rounded once, to nearest even like BFloat16(float).
//
// Not yet measured on an AMX machine, so cpu::gemm only runs it when forced (gemm_bf16.h).
#pragma once
#include <cstdint>
#include <string>

#include "core/half.h"

namespace ember::cpu {

// Whether this process may run AMX tile instructions: the CPU has AMX-BF16 and Linux granted the
// tile data state. The first call asks Linux (arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)); the
// answer holds for the process.
bool amx_tiles_usable();
// Why amx_tiles_usable() is false; empty when it is true.
std::string amx_tiles_unusable_reason();

// An ember::Error naming the reason where amx_tiles_usable() is false.
void gemm_bf16_amx_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta, float* c,
                          int64_t ldc);
void gemm_bf16_amx_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta, BFloat16* c,
                          int64_t ldc);

// For tests only: the same kernel, packing and blocking with every tile instruction emulated in
// plain C++ as the Intel SDM documents it, so it runs on any CPU (slowly: about 8000 scalar
// multiply-adds per tdpbf16ps). Only the swap to the real instructions is left untested by it.
void gemm_bf16_amx_emulated_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                   const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta,
                                   float* c, int64_t ldc);
void gemm_bf16_amx_emulated_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                   const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta,
                                   BFloat16* c, int64_t ldc);

}  // namespace ember::cpu
