// How every CPU GEMM is threaded: C is cut into bands of rows (from the same rows of op(A)
// and all of op(B)) or of columns (all of op(A), the same columns of op(B)), one per thread of
// Ember's pool. Bands never overlap, so nothing is shared but the read-only inputs, and each
// band runs a single-threaded GEMM.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/parallel.h"

namespace ember::cpu {

// Below this many multiply-adds (about 5 us on one core) a GEMM is not worth splitting.
inline constexpr double kMinParallelGemmWork = 64.0 * 64.0 * 64.0;
// Split points fall on multiples of this, so every part keeps whole register tiles.
inline constexpr int64_t kGemmSplitAlign = 32;

// Calls serial(m_band, n_band, a_band, b_band, c_band) once per band (row-major C with row
// stride ldc; A and B laid out as in cpu::gemm), or once for the whole product when it is too
// small to split or already runs inside a parallel region.
template <typename TA, typename TB, typename TC, typename Serial>
void gemm_in_bands(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const TA* a, int64_t lda,
                   const TB* b, int64_t ldb, TC* c, int64_t ldc, Serial&& serial) {
  const int64_t threads = in_parallel_region() ? 1 : get_num_threads();
  const bool split_rows = m >= n;
  const int64_t extent = split_rows ? m : n;
  const int64_t parts = std::min(threads, (extent + kGemmSplitAlign - 1) / kGemmSplitAlign);
  if (parts <= 1 || double(m) * double(n) * double(k) < kMinParallelGemmWork) {
    serial(m, n, a, b, c);
    return;
  }
  const int64_t chunk = (extent + parts - 1) / parts;
  const int64_t band = (chunk + kGemmSplitAlign - 1) / kGemmSplitAlign * kGemmSplitAlign;
  parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t lo = std::min(extent, p * band), hi = std::min(extent, lo + band);
      if (lo >= hi) continue;
      if (split_rows) {
        serial(hi - lo, n, trans_a ? a + lo : a + lo * lda, b, c + lo * ldc);
      } else {
        serial(m, hi - lo, a, trans_b ? b + lo * ldb : b + lo, c + lo);
      }
    }
  });
}

}  // namespace ember::cpu
