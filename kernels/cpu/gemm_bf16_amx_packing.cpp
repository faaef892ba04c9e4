// The tile packing behind gemm_bf16_amx_packing.h. A full tile is rearranged straight from the
// operand with 128-bit shuffles; a tile at an edge is first copied into a zeroed block of full
// size, then rearranged the same way, so the shuffles see only full blocks.
#include "kernels/cpu/gemm_bf16_amx_packing.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/amx_tile_config.h"

namespace ember::cpu::amx {
namespace {

// Copies rows x cols values (row stride ld) into a zeroed rows_full x cols_full block.
void copy_zero_padded(const BFloat16* src, int64_t ld, int64_t rows, int64_t cols, int rows_full, int cols_full,
                      BFloat16* block) {
  std::memset(static_cast<void*>(block), 0, sizeof(BFloat16) * size_t(rows_full * cols_full));
  for (int64_t r = 0; r < rows; ++r) std::memcpy(block + r * cols_full, src + r * ld, sizeof(BFloat16) * size_t(cols));
}

inline __m128i load8(const BFloat16* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline void store8(BFloat16* p, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }

// 8 x 8 16-bit values: out row c = column c of the 8 input rows.
inline void transpose8x16bit(const __m128i in[8], __m128i out[8]) {
  __m128i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm_unpacklo_epi16(in[2 * i], in[2 * i + 1]);
    t[2 * i + 1] = _mm_unpackhi_epi16(in[2 * i], in[2 * i + 1]);
  }
  // u[0..3]: columns (0,1), (2,3), (4,5), (6,7) of rows 0-3; u[4..7] the same of rows 4-7.
  for (int h = 0; h < 2; ++h) {
    u[4 * h + 0] = _mm_unpacklo_epi32(t[4 * h + 0], t[4 * h + 2]);
    u[4 * h + 1] = _mm_unpackhi_epi32(t[4 * h + 0], t[4 * h + 2]);
    u[4 * h + 2] = _mm_unpacklo_epi32(t[4 * h + 1], t[4 * h + 3]);
    u[4 * h + 3] = _mm_unpackhi_epi32(t[4 * h + 1], t[4 * h + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = _mm_unpacklo_epi64(u[i], u[4 + i]);
    out[2 * i + 1] = _mm_unpackhi_epi64(u[i], u[4 + i]);
  }
}

// 4 x 4 32-bit words: out row c = column c of the 4 input rows.
inline void transpose4x32bit(const __m128i in[4], __m128i out[4]) {
  const __m128i t0 = _mm_unpacklo_epi32(in[0], in[1]), t1 = _mm_unpackhi_epi32(in[0], in[1]);
  const __m128i t2 = _mm_unpacklo_epi32(in[2], in[3]), t3 = _mm_unpackhi_epi32(in[2], in[3]);
  out[0] = _mm_unpacklo_epi64(t0, t2);
  out[1] = _mm_unpackhi_epi64(t0, t2);
  out[2] = _mm_unpacklo_epi64(t1, t3);
  out[3] = _mm_unpackhi_epi64(t1, t3);
}

// ---- A tiles (16 rows of op(A) by 32 values of k)

// op(A) = A: tile row r is 32 consecutive values of stored row r.
void a_tile_rows(const BFloat16* src, int64_t ld, BFloat16* tile) {
  for (int r = 0; r < kTileRows; ++r) std::memcpy(tile + r * kTileK, src + r * ld, sizeof(BFloat16) * kTileK);
}

// op(A) = A^T: stored row kk holds value kk of 16 consecutive tile rows; 8 x 8 blocks turn over.
void a_tile_transposed(const BFloat16* src, int64_t ld, BFloat16* tile) {
  for (int k0 = 0; k0 < kTileK; k0 += 8)
    for (int r0 = 0; r0 < kTileRows; r0 += 8) {
      __m128i in[8], out[8];
      for (int i = 0; i < 8; ++i) in[i] = load8(src + (k0 + i) * ld + r0);
      transpose8x16bit(in, out);
      for (int i = 0; i < 8; ++i) store8(tile + (r0 + i) * kTileK + k0, out[i]);
    }
}

// ---- B tiles (16 k-pairs by 16 columns of op(B), each pair one 32-bit word)

// op(B) = B: tile row q interleaves stored rows 2q and 2q + 1.
void b_tile_rows(const BFloat16* src, int64_t ld, BFloat16* tile) {
  for (int q = 0; q < kTileRows; ++q) {
    const BFloat16* even = src + 2 * q * ld;
    const BFloat16* odd = even + ld;
    BFloat16* row = tile + q * 2 * kTileCols;
    for (int half = 0; half < 2; ++half) {
      const __m128i e = load8(even + 8 * half), o = load8(odd + 8 * half);
      store8(row + 16 * half, _mm_unpacklo_epi16(e, o));
      store8(row + 16 * half + 8, _mm_unpackhi_epi16(e, o));
    }
  }
}

// op(B) = B^T: stored row j holds column j's k-pairs as consecutive words; 4 x 4 word blocks
// turn over.
void b_tile_transposed(const BFloat16* src, int64_t ld, BFloat16* tile) {
  for (int q0 = 0; q0 < kTileRows; q0 += 4)
    for (int j0 = 0; j0 < kTileCols; j0 += 4) {
      __m128i in[4], out[4];
      for (int i = 0; i < 4; ++i) in[i] = load8(src + (j0 + i) * ld + 2 * q0);
      transpose4x32bit(in, out);
      for (int i = 0; i < 4; ++i) store8(tile + (q0 + i) * 2 * kTileCols + 2 * j0, out[i]);
    }
}

// Rearranges a rows x cols block of the operand (row stride ld) with `full_tile`, which reads a
// ROWS x COLS block: straight from the operand when the block is whole, else from a zero-padded
// copy.
template <int ROWS, int COLS, typename FullTile>
void pack_tile(FullTile full_tile, const BFloat16* src, int64_t ld, int64_t rows, int64_t cols, BFloat16* tile) {
  if (rows == ROWS && cols == COLS) {
    full_tile(src, ld, tile);
    return;
  }
  alignas(64) BFloat16 edge[ROWS * COLS];
  copy_zero_padded(src, ld, rows, cols, ROWS, COLS, edge);
  full_tile(edge, COLS, tile);
}

// Calls pack(tile, first, count, k0, k_count) for every tile of the panels covering `extent`
// rows (A) or columns (B): `count` of them from `first`, k_count values of k from k0.
template <typename PackOne>
void for_each_tile(int64_t extent, int64_t k, BFloat16* out, PackOne pack) {
  const int64_t blocks = k_blocks(k);
  for (int64_t p = 0; p * kTileRows < extent; ++p) {
    const int64_t first = p * kTileRows, count = std::min<int64_t>(kTileRows, extent - first);
    for (int64_t kb = 0; kb < blocks; ++kb) {
      const int64_t k0 = kb * kTileK;
      pack(out + (p * blocks + kb) * kTileBf16, first, count, k0, std::min<int64_t>(kTileK, k - k0));
    }
  }
}

}  // namespace

void pack_a(bool trans_a, const BFloat16* a, int64_t lda, int64_t i0, int64_t rows, int64_t k, BFloat16* out) {
  for_each_tile(rows, k, out, [&](BFloat16* tile, int64_t r0, int64_t r_count, int64_t k0, int64_t k_count) {
    if (!trans_a)
      pack_tile<kTileRows, kTileK>(a_tile_rows, a + (i0 + r0) * lda + k0, lda, r_count, k_count, tile);
    else
      pack_tile<kTileK, kTileRows>(a_tile_transposed, a + k0 * lda + i0 + r0, lda, k_count, r_count, tile);
  });
}

void pack_b(bool trans_b, const BFloat16* b, int64_t ldb, int64_t j0, int64_t cols, int64_t k, BFloat16* out) {
  static_assert(kTileCols == kTileRows, "B panels are as wide as A panels are tall");
  for_each_tile(cols, k, out, [&](BFloat16* tile, int64_t c0, int64_t c_count, int64_t k0, int64_t k_count) {
    if (!trans_b)
      pack_tile<kTileK, kTileCols>(b_tile_rows, b + k0 * ldb + j0 + c0, ldb, k_count, c_count, tile);
    else
      pack_tile<kTileCols, kTileK>(b_tile_transposed, b + (j0 + c0) * ldb + k0, ldb, c_count, k_count, tile);
  });
}

}  // namespace ember::cpu::amx
