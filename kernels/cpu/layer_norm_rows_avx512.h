// Layer norm row loops of kernels/cpu/layer_norm_rows.h on 16 float lanes (AVX-512), for rows
// whose length is a multiple of 16. Every element rounds as in the 8-lane loops and the row sums
// are the same chains of 8-lane adds in the same order (each 16-lane step adds its low half, then
// its high half), so results are identical bit for bit whichever runs; the gain is half the loads
// and stores, which bound these passes. Call only when cpu_capability() is
// CpuCapability::Avx512 (avx512f, bw, vl, dq).
#pragma once
#include <cstdint>

namespace ember::cpu {

// layer_norm_apply_row with both w and b, n a multiple of 16.
void layer_norm_apply_row_avx512(float* y, const float* h, int64_t n, float mean, float rstd, const float* w,
                                 const float* b);

// layer_norm_backward_row, n a multiple of 16 (w, dw, db, dh_copy may be null as there).
void layer_norm_backward_row_avx512(float* dh, const float* g, const float* h, int64_t n, float mean, float rstd,
                                    const float* w, float* dw, float* db, float* dh_copy);

}  // namespace ember::cpu
