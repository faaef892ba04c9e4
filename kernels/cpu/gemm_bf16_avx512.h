// Ember's own bf16 GEMM for CPUs with AVX512-BF16: vdpbf16ps multiplies pairs of bf16 values
// and adds both products to an f32 lane, so B is packed with the two values of each k-pair
// side by side and A supplies each pair as one broadcast 32-bit word.
//
// Same contract as cpu::gemm (gemm.h), for one band of C on the calling thread: the caller
// splits the work across threads. Call only when cpu_features() reports avx512f, avx512bw,
// avx512vl, avx512dq and avx512_bf16 (the code uses those instructions unconditionally).
// The sum for every entry of C runs in the same order whatever the band's shape, so results
// do not depend on how the caller splits C.
#pragma once
#include <cstdint>

#include "core/half.h"

namespace ember::cpu {

void gemm_bf16_avx512_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                             const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta, float* c,
                             int64_t ldc);
void gemm_bf16_avx512_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                             const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta,
                             BFloat16* c, int64_t ldc);

// How many times more flops per second vdpbf16ps delivers than f32 FMAs on this core, timed
// once (about 0.3 ms, at the first call) on register-only loops. It is 2 on a core that issues
// vdpbf16ps as often as an f32 FMA; on the Intel Xeon (with AMX) this kernel was measured on it
// is 0.5: vdpbf16ps issues once per two cycles against two FMAs per cycle. Call only where
// gemm_bf16_avx512_serial may run.
double bf16_dot_product_speedup();

}  // namespace ember::cpu
