// The blocked bf16 GEMM behind gemm_bf16_avx512.h.
//
// vdpbf16ps (_mm512_dpbf16_ps) takes 16 pairs of bf16 values from each source and adds
// a[2i] * b[2i] + a[2i + 1] * b[2i + 1] to f32 lane i. A register tile of kRows rows by kCols
// columns of C lives in kRows * kVectors accumulators; each step of the inner loop loads
// kVectors vectors of packed B (one k-pair of kCols columns, the two values of each column
// side by side) and, per row, broadcasts that row's k-pair of A as one 32-bit word.
//
// Blocking: C is walked in blocks of block_cols columns, whose B (all of k) is packed once
// into column strips kCols wide, about kPackedBBudget bytes per k-chunk; then in blocks of
// block_rows rows, about kABlockBudget bytes of A per k-chunk. A is read where it lies when
// stored row-major (each k-pair of a row is already one 32-bit word); stored transposed it is
// packed into row panels of kRows first. Long inner dimensions are cut into chunks of at most
// kMaxChunk: f32 output accumulates the chunks in C itself, bf16 output in an f32 staging block
// that is rounded into C once at the end, so a bf16 C is rounded exactly once.
//
// Every entry of C is summed k-pair by k-pair in the same order in every tile shape, so the
// result is independent of the band or tile an entry falls in (and of the thread count).
// vdpbf16ps treats bf16 subnormals as zero and flushes subnormal results, as oneDNN's
// bf16 kernels do; a bf16 C is rounded to nearest even like BFloat16(float).
//
// How fast it runs against oneDNN and the widened path, and when it is chosen: the header of
// gemm_bf16.cpp.

// GCC 12's AVX-512 intrinsic headers start some results from a deliberately undefined
// register, which -Wmaybe-uninitialized reports once inlined (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/cpu/gemm_bf16_avx512.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include "core/error.h"
#include "kernels/cpu/aligned_buffer.h"

// AVX-512 code, reached only after a run-time check (see gemm_bf16.cpp); everything below
// is compiled for it and nothing here is inline in a header another file could pick up.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#if defined(__clang__)  // clang ignores the GCC pragma; this is its equivalent
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))), apply_to = function)
#endif

namespace ember::cpu {
namespace {

constexpr int kVectors = 2;              // accumulator vectors per tile row
constexpr int kCols = 16 * kVectors;     // tile columns: one f32 lane each
constexpr int kRows = 14;                // tile rows: 28 accumulators, 2 B vectors, 1 broadcast
constexpr int64_t kMaxChunk = 512;       // inner-dimension chunk (even)
constexpr int64_t kPackedBBudget = 512 * 1024;
constexpr int64_t kABlockBudget = 256 * 1024;

// ---- scratch memory

enum class ScratchRole { kPackedB, kPackedA, kStaging };

// Per-thread, 64-byte aligned, grown as needed; one per role so the roles never alias.
template <ScratchRole Role>
void* scratch(size_t bytes) {
  thread_local AlignedBuffer buffer;
  return buffer.get(bytes, "bf16 gemm");
}

// ---- vector utilities

inline uint32_t load_u32(const BFloat16* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline __mmask16 mask16(int64_t count) {
  return count >= 16 ? __mmask16(0xffff) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
}
inline __mmask32 mask32(int64_t count) {
  return count >= 32 ? __mmask32(0xffffffffu) : count <= 0 ? __mmask32(0) : __mmask32((1u << count) - 1);
}

inline __m512bh as_bf16(__m512i v) { return reinterpret_cast<__m512bh>(v); }

// Words j = 0..15 of a k-pair: row0[j] in the low half, row1[j] (or 0 without row1) in the
// high half; columns past `count` are zero.
inline __m512i interleave16(const BFloat16* row0, const BFloat16* row1, int64_t count) {
  const __mmask16 m = mask16(count);
  const __m256i lo = _mm256_maskz_loadu_epi16(m, row0);
  const __m256i hi = row1 != nullptr ? _mm256_maskz_loadu_epi16(m, row1) : _mm256_setzero_si256();
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(order, both);
}

// r[i] (16 words of row i) becomes column i: afterwards r[j] holds word j of every row.
inline void transpose16(__m512i r[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // Per 128-bit lane L, b[4i + c] holds word 4L + c of rows 4i .. 4i + 3.
  for (int i = 0; i < 4; ++i) {
    b[4 * i + 0] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i even_lo = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x88);  // lanes 0, 2 of rows 0-7
    const __m512i odd_lo = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xdd);   // lanes 1, 3
    const __m512i even_hi = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x88);
    const __m512i odd_hi = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xdd);
    r[c] = _mm512_shuffle_i32x4(even_lo, even_hi, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(odd_lo, odd_hi, 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(even_lo, even_hi, 0xdd);
    r[12 + c] = _mm512_shuffle_i32x4(odd_lo, odd_hi, 0xdd);
  }
}

// ---- instruction throughput

// Runs `iterations` steps of 24 independent vdpbf16ps (or f32 FMA) chains in registers and
// returns the seconds taken. The barrier keeps the compiler from folding the loop.
template <bool DOT>
__attribute__((noinline)) double time_chains(int64_t iterations) {
  __m512 acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(float(i));
  __m512i x = _mm512_set1_epi32(0x3f803f80);  // bf16 pairs (1, 1); as f32 about 1.0
  const __m512i y = _mm512_set1_epi32(0x24002400);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < 24; ++i) {
      if constexpr (DOT)
        acc[i] = _mm512_dpbf16_ps(acc[i], as_bf16(x), as_bf16(y));
      else
        acc[i] = _mm512_fmadd_ps(_mm512_castsi512_ps(x), _mm512_castsi512_ps(y), acc[i]);
    }
    __asm__ volatile("" : "+v"(x));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  __m512 sum = acc[0];
  for (int i = 1; i < 24; ++i) sum = _mm512_add_ps(sum, acc[i]);
  volatile float sink = _mm512_cvtss_f32(sum);
  (void)sink;
  return seconds;
}

double measure_dot_product_speedup() {
  // Rounds alternate, and the fastest of each counts: a descheduled round or the wide units
  // powering up only slows a round down. About 0.3 ms in all.
  constexpr int64_t kIterations = 2000;
  double dot = 1e30, fma = 1e30;
  for (int round = 0; round < 6; ++round) {
    dot = std::min(dot, time_chains<true>(kIterations));
    fma = std::min(fma, time_chains<false>(kIterations));
  }
  // vdpbf16ps does 64 flops per instruction, an f32 FMA 32.
  return (64.0 / dot) / (32.0 / fma);
}

// ---- packing

// One strip of op(B): columns [j0, j0 + width) (width <= kCols, the rest zero), all k, as
// pairs(k) rows of kCols words; an odd k's last pair has a zero high half.
void pack_b_strip(bool trans_b, const BFloat16* b, int64_t ldb, int64_t k, int64_t j0, int64_t width,
                  uint32_t* out) {
  const int64_t pairs = (k + 1) / 2;
  if (!trans_b) {
    // op(B) row kk is stored row kk: interleave rows 2p and 2p + 1.
    for (int64_t p = 0; p < pairs; ++p) {
      const BFloat16* row0 = b + 2 * p * ldb + j0;
      const BFloat16* row1 = 2 * p + 1 < k ? row0 + ldb : nullptr;
      for (int v = 0; v < kVectors; ++v) {
        const int64_t count = width - 16 * v;
        const __m512i words = interleave16(row0 + 16 * v, row1 != nullptr ? row1 + 16 * v : nullptr, count);
        _mm512_store_si512(out + p * kCols + 16 * v, words);
      }
    }
    return;
  }
  // Stored transposed, column j of op(B) is stored row j, whose k-pairs are already words:
  // transpose 16 x 16 blocks of words.
  for (int64_t p0 = 0; p0 < pairs; p0 += 16) {
    const __mmask32 valid = mask32(k - 2 * p0);
    const int64_t block_pairs = std::min<int64_t>(16, pairs - p0);
    for (int v = 0; v < kVectors; ++v) {
      __m512i r[16];
      for (int t = 0; t < 16; ++t) {
        const int64_t j = 16 * v + t;
        r[t] = j < width ? _mm512_maskz_loadu_epi16(valid, b + (j0 + j) * ldb + 2 * p0) : _mm512_setzero_si512();
      }
      transpose16(r);
      for (int64_t t = 0; t < block_pairs; ++t) _mm512_store_si512(out + (p0 + t) * kCols + 16 * v, r[t]);
    }
  }
}

// Rows [i0, i0 + rows) of op(A) = A^T (A stored k x m), all k, as one panel of pairs(k) rows of
// kRows words (row i's k-pair at word p * kRows + i; missing rows zero).
void pack_a_panel_transposed(const BFloat16* a, int64_t lda, int64_t k, int64_t i0, int64_t rows, uint32_t* out) {
  const int64_t pairs = (k + 1) / 2;
  const __mmask16 store = mask16(kRows);
  for (int64_t p = 0; p < pairs; ++p) {
    const BFloat16* row0 = a + 2 * p * lda + i0;
    const BFloat16* row1 = 2 * p + 1 < k ? row0 + lda : nullptr;
    _mm512_mask_storeu_epi32(out + p * kRows, store, interleave16(row0, row1, rows));
  }
}

// ---- the register tile

inline __m512 load_c(const float* c, __mmask16 m) { return _mm512_maskz_loadu_ps(m, c); }
inline __m512 load_c(const BFloat16* c, __mmask16 m) {
  const __m256i bits = _mm256_maskz_loadu_epi16(m, c);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

inline void store_c(float* c, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(c, m, v); }
// Round to nearest even, NaN stays a quiet NaN: the same bits as BFloat16(float).
inline void store_c(BFloat16* c, __m512 v, __mmask16 m) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i bits = _mm512_mask_blend_epi32(nan, rounded, quiet);
  _mm256_mask_storeu_epi16(c, m, _mm512_cvtepi32_epi16(bits));
}

// Where a tile reads A: row i's k-pair p is the 32-bit word at a + i * row_step + p * pair_step
// (in bf16 elements). Rows of A stored row-major: row_step = lda, pair_step = 2. A packed
// panel: row_step = 2, pair_step = 2 * kRows.
struct ASource {
  const BFloat16* a;
  int64_t row_step;
};

// C[0..ROWS) x [0..cols) = alpha * (A B) + beta * C over `pairs` k-pairs plus, when `odd`, one
// last single k (its B pair has a zero high half; A's high half is not read). beta == 0
// leaves C unread.
template <int ROWS, bool PACKED, typename Out>
void tile(int64_t pairs, bool odd, ASource ap, const uint32_t* b, Out* c, int64_t ldc, int64_t cols, float alpha,
          float beta) {
  constexpr int64_t pair_step = PACKED ? 2 * kRows : 2;
  const int64_t row_step = PACKED ? 2 : ap.row_step;
  __m512 acc[ROWS][kVectors];
#pragma GCC unroll 16
  for (int i = 0; i < ROWS; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) acc[i][v] = _mm512_setzero_ps();

  const BFloat16* a = ap.a;
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh bv[kVectors];
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) bv[v] = as_bf16(_mm512_load_si512(b + 16 * v));
#pragma GCC unroll 16
    for (int i = 0; i < ROWS; ++i) {
      const __m512bh av = as_bf16(_mm512_set1_epi32(int(load_u32(a + i * row_step))));
#pragma GCC unroll 4
      for (int v = 0; v < kVectors; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, bv[v]);
    }
    a += pair_step;
    b += kCols;
  }
  if (odd) {
    __m512bh bv[kVectors];
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) bv[v] = as_bf16(_mm512_load_si512(b + 16 * v));
#pragma GCC unroll 16
    for (int i = 0; i < ROWS; ++i) {
      const __m512bh av = as_bf16(_mm512_set1_epi32(int(a[i * row_step].bits)));
#pragma GCC unroll 4
      for (int v = 0; v < kVectors; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, bv[v]);
    }
  }

  const __m512 alpha_v = _mm512_set1_ps(alpha), beta_v = _mm512_set1_ps(beta);
  __mmask16 masks[kVectors];
#pragma GCC unroll 4
  for (int v = 0; v < kVectors; ++v) masks[v] = mask16(cols - 16 * v);
#pragma GCC unroll 16
  for (int i = 0; i < ROWS; ++i) {
    Out* row = c + i * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) {
      if (masks[v] == 0) continue;
      __m512 r = _mm512_mul_ps(alpha_v, acc[i][v]);
      if (beta != 0.0f) r = _mm512_fmadd_ps(beta_v, load_c(row + 16 * v, masks[v]), r);
      store_c(row + 16 * v, r, masks[v]);
    }
  }
}

template <bool PACKED, typename Out>
using TileFn = void (*)(int64_t, bool, ASource, const uint32_t*, Out*, int64_t, int64_t, float, float);

// tiles<PACKED, Out>()[rows - 1] handles `rows` rows.
template <bool PACKED, typename Out, int... R>
constexpr auto make_tiles(std::integer_sequence<int, R...>) {
  return std::array<TileFn<PACKED, Out>, sizeof...(R)>{&tile<R + 1, PACKED, Out>...};
}
template <bool PACKED, typename Out>
const auto& tiles() {
  static constexpr auto table = make_tiles<PACKED, Out>(std::make_integer_sequence<int, kRows>());
  return table;
}

// ---- blocking

inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// C block = alpha * op(A) op(B) + beta * C for `rows` rows of A (a packed panel set, or rows
// where they lie) and the packed B block `packed_b` (strips of kCols columns, `block_cols`
// columns in all), chunk by chunk: chunks after the first add to C. Acc is what C holds: the
// caller's C, or f32 staging for a chunked bf16 C.
template <bool PACKED, typename Acc>
void block_product(int64_t rows, int64_t block_cols, int64_t k, int64_t chunk, float alpha, float beta,
                   const BFloat16* a_base, int64_t a_row_step, const uint32_t* packed_b, Acc* c, int64_t ldc) {
  const int64_t pairs = (k + 1) / 2, strip_words = pairs * kCols;
  const auto& run = tiles<PACKED, Acc>();
  for (int64_t k0 = 0; k0 < k; k0 += chunk) {
    const int64_t kc = std::min(chunk, k - k0);
    const float beta_now = k0 == 0 ? beta : 1.0f;
    for (int64_t j = 0; j < block_cols; j += kCols) {
      const uint32_t* strip = packed_b + (j / kCols) * strip_words + (k0 / 2) * kCols;
      const int64_t cols = std::min<int64_t>(kCols, block_cols - j);
      for (int64_t i = 0; i < rows; i += kRows) {
        const int64_t tile_rows = std::min<int64_t>(kRows, rows - i);
        // A packed panel holds kRows rows of all pairs; rows of A where they lie step by a_row_step.
        const BFloat16* a =
            PACKED ? a_base + (i / kRows) * pairs * kRows * 2 + k0 * kRows : a_base + i * a_row_step + k0;
        run[size_t(tile_rows - 1)](kc / 2, kc % 2 != 0, ASource{a, a_row_step}, strip, c + i * ldc + j, ldc, cols,
                                   alpha, beta_now);
      }
    }
  }
}

template <typename Out>
void gemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const BFloat16* a,
                 int64_t lda, const BFloat16* b, int64_t ldb, float beta, Out* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k == 0 || alpha == 0.0f) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        Out& v = c[i * ldc + j];
        v = Out(beta == 0.0f ? 0.0f : beta * float(v));
      }
    return;
  }
  // Chunks of equal even length, so only the last chunk can end on a single k.
  const int64_t chunks = (k + kMaxChunk - 1) / kMaxChunk;
  const int64_t chunk = round_up((k + chunks - 1) / chunks, 2);
  const int64_t pairs = (k + 1) / 2;
  const int64_t block_cols =
      std::min(round_up(n, kCols), std::max<int64_t>(kCols, kPackedBBudget / (2 * chunk) / kCols * kCols));
  const int64_t block_rows = std::min(m, std::max<int64_t>(kRows, kABlockBudget / (2 * chunk) / kRows * kRows));
  const bool staged = std::is_same_v<Out, BFloat16> && chunks > 1;

  const size_t packed_b_words = size_t(block_cols * pairs);  // block_cols is a multiple of kCols
  const size_t packed_a_words = size_t(round_up(block_rows, kRows) * pairs);
  auto* packed_b = static_cast<uint32_t*>(scratch<ScratchRole::kPackedB>(packed_b_words * 4));
  auto* packed_a = trans_a ? static_cast<uint32_t*>(scratch<ScratchRole::kPackedA>(packed_a_words * 4)) : nullptr;
  auto* staging = staged ? static_cast<float*>(scratch<ScratchRole::kStaging>(size_t(block_rows * block_cols) * 4))
                         : nullptr;

  for (int64_t j0 = 0; j0 < n; j0 += block_cols) {
    const int64_t cols = std::min(block_cols, n - j0);
    for (int64_t j = 0; j < cols; j += kCols)
      pack_b_strip(trans_b, trans_b ? b + j0 * ldb : b + j0, ldb, k, j, std::min<int64_t>(kCols, cols - j),
                   packed_b + (j / kCols) * pairs * kCols);
    for (int64_t i0 = 0; i0 < m; i0 += block_rows) {
      const int64_t rows = std::min(block_rows, m - i0);
      const BFloat16* a_base;
      int64_t a_row_step;
      if (trans_a) {
        for (int64_t i = 0; i < rows; i += kRows)
          pack_a_panel_transposed(a, lda, k, i0 + i, std::min<int64_t>(kRows, rows - i),
                                  packed_a + (i / kRows) * pairs * kRows);
        a_base = reinterpret_cast<const BFloat16*>(packed_a);
        a_row_step = 2;
      } else {
        a_base = a + i0 * lda;
        a_row_step = lda;
      }
      Out* c_block = c + i0 * ldc + j0;
      if (staged) {
        // Accumulate alpha * A B in f32, then round C = staging + beta * C once.
        if (trans_a)
          block_product<true>(rows, cols, k, chunk, alpha, 0.0f, a_base, a_row_step, packed_b, staging, block_cols);
        else
          block_product<false>(rows, cols, k, chunk, alpha, 0.0f, a_base, a_row_step, packed_b, staging, block_cols);
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; j += 16) {
            const __mmask16 mk = mask16(cols - j);
            __m512 r = _mm512_maskz_loadu_ps(mk, staging + i * block_cols + j);
            if (beta != 0.0f) r = _mm512_fmadd_ps(_mm512_set1_ps(beta), load_c(c_block + i * ldc + j, mk), r);
            store_c(c_block + i * ldc + j, r, mk);
          }
      } else if (trans_a) {
        block_product<true>(rows, cols, k, chunk, alpha, beta, a_base, a_row_step, packed_b, c_block, ldc);
      } else {
        block_product<false>(rows, cols, k, chunk, alpha, beta, a_base, a_row_step, packed_b, c_block, ldc);
      }
    }
  }
}

}  // namespace

double bf16_dot_product_speedup() {
  static const double speedup = measure_dot_product_speedup();
  return speedup;
}

void gemm_bf16_avx512_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                             const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta, float* c,
                             int64_t ldc) {
  gemm_serial(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_bf16_avx512_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                             const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta,
                             BFloat16* c, int64_t ldc) {
  gemm_serial(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace ember::cpu

#if defined(__clang__)
#pragma clang attribute pop
#endif
#pragma GCC pop_options
#pragma GCC diagnostic pop
