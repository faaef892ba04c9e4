// weight_dots_avx512 (convolution_weight_dots_avx512.h): each zmm accumulator holds the 8-lane sums
// of two rows side by side, so every (output channel, row) pair still sums its positions 8 lanes
// wide in the AVX2 tile's order and ends in the same horizontal reduction. The rows are first
// interleaved by pairs, 8 positions of one then 8 of the other, so a pair's 16 values are one load;
// dY's 8 positions are one load broadcast to both halves. A tile of 6 output channels by 4 pairs
// keeps 24 accumulators: 24 FMAs of 16 lanes per 4 + 6 loads (on ResNet-18's 64->128 1x1 stride-2
// layer 105 GFLOP/s, where 4 by 3 pairs, the AVX2 tile's shape, ran at 102).

#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/convolution_weight_dots_avx512.h"

#include "kernels/cpu/avx512_code_begin.inc"

namespace ember::cpu {
namespace {

// The register tiles: 6 output channels by 4 pairs of rows, or, where all the rows make at most 5
// pairs (a first layer's taps), 4 by all of them, so dY is read once per output tile.
constexpr int kTileO = 6;
constexpr int kTilePairs = 4;
constexpr int kNarrowTileO = 4;
constexpr int kNarrowTileMaxPairs = 5;
constexpr int64_t kLanes = 8;  // the positions a sum runs over in parallel, as on AVX2

int64_t chunks_of(const WeightDots& d) { return (d.area + kLanes - 1) / kLanes; }
int64_t pairs_of(const WeightDots& d) { return (d.rows + 1) / 2; }
// One image's interleaved rows.
int64_t pairs_image(const WeightDots& d) { return pairs_of(d) * chunks_of(d) * 2 * kLanes; }

// One image's rows as pairs: xp[((r / 2) * chunks + k) * 16 + (r % 2) * 8 + l] = row r [8 k + l],
// zero past the area and in a missing odd row's half.
void interleave_pairs(const WeightDots& d, const float* const* rows, float* xp) {
  const int64_t chunks = chunks_of(d), full = d.area / kLanes;
  const __mmask8 tail = __mmask8((1u << (d.area - full * kLanes)) - 1);
  for (int64_t pair = 0; pair < pairs_of(d); ++pair) {
    const float* a = rows[2 * pair];
    const float* b = 2 * pair + 1 < d.rows ? rows[2 * pair + 1] : nullptr;
    float* out = xp + pair * chunks * 2 * kLanes;
    for (int64_t k = 0; k < chunks; ++k) {
      const __mmask8 lanes = k < full ? __mmask8(0xff) : tail;
      _mm256_storeu_ps(out + 2 * kLanes * k, _mm256_maskz_loadu_ps(lanes, a + kLanes * k));
      _mm256_storeu_ps(out + 2 * kLanes * k + kLanes,
                       b ? _mm256_maskz_loadu_ps(lanes, b + kLanes * k) : _mm256_setzero_ps());
    }
  }
}

// The AVX2 tile's reduction (reduce4): the lanes of four sums as one vector of their totals.
__m128 reduce4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// dw[o0 + i][r] += the sums for i < OB and the rows r of pairs [pair0, pair0 + PB) that exist. dY's
// last partial vector is loaded under a mask, as on AVX2:
// past it lies the next row (or the end of the tensor), which may hold anything.
template <int OB, int PB>
void tile(const WeightDots& d, const float* dy, int64_t dy_image, const float* xp, int64_t images, int64_t o0,
          int64_t pair0, float* dw) {
  const int64_t area = d.area, full = area / kLanes * kLanes, chunks = chunks_of(d), xp_image = pairs_image(d);
  const __mmask8 tail = __mmask8((1u << (area - full)) - 1);
  __m512 acc[OB][PB];
  for (int i = 0; i < OB; ++i)
    for (int j = 0; j < PB; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t n = 0; n < images; ++n) {
    const float* y = dy + n * dy_image + o0 * area;
    const float* x = xp + n * xp_image + pair0 * chunks * 2 * kLanes;
    // Positions [8 k, 8 k + 8), the last chunk's dY under the mask.
    for (int64_t k = 0; k < chunks; ++k) {
      const __mmask8 lanes = k * kLanes < full ? __mmask8(0xff) : tail;
      __m512 xv[PB];
      for (int j = 0; j < PB; ++j) xv[j] = _mm512_loadu_ps(x + (j * chunks + k) * 2 * kLanes);
      for (int i = 0; i < OB; ++i) {
        const __m512 yv = _mm512_broadcast_f32x8(_mm256_maskz_loadu_ps(lanes, y + i * area + k * kLanes));
        for (int j = 0; j < PB; ++j) acc[i][j] = _mm512_fmadd_ps(yv, xv[j], acc[i][j]);
      }
    }
  }
  // Each accumulator's halves to memory, then the AVX2 reduction per input channel (the loops over
  // the accumulators stay fully unrolled, so they live in registers above).
  alignas(64) float sums_by_lane[PB][OB][2 * kLanes];
#pragma GCC unroll 8
  for (int j = 0; j < PB; ++j)
#pragma GCC unroll 8
    for (int i = 0; i < OB; ++i) _mm512_store_ps(sums_by_lane[j][i], acc[i][j]);
  for (int j = 0; j < PB; ++j)
    for (int half = 0; half < 2 && 2 * (pair0 + j) + half < d.rows; ++half)
      for (int i0 = 0; i0 < OB; i0 += 4) {  // four output channels per reduction, as on AVX2
        __m256 col[4];
        for (int i = 0; i < 4; ++i)
          col[i] = i0 + i < OB ? _mm256_load_ps(sums_by_lane[j][i0 + i < OB ? i0 + i : 0] + half * kLanes)
                               : _mm256_setzero_ps();
        alignas(16) float sums[4];
        _mm_store_ps(sums, reduce4(col[0], col[1], col[2], col[3]));
        for (int i = 0; i < 4 && i0 + i < OB; ++i) dw[(o0 + i0 + i) * d.rows + 2 * (pair0 + j) + half] += sums[i];
      }
}

template <int OB>
void tile_row(int pb, const WeightDots& d, const float* dy, int64_t dy_image, const float* xp, int64_t images,
              int64_t o0, int64_t pair0, float* dw) {
  switch (pb) {
    case 1:
      return tile<OB, 1>(d, dy, dy_image, xp, images, o0, pair0, dw);
    case 2:
      return tile<OB, 2>(d, dy, dy_image, xp, images, o0, pair0, dw);
    case 3:
      return tile<OB, 3>(d, dy, dy_image, xp, images, o0, pair0, dw);
    case 4:
      return tile<OB, 4>(d, dy, dy_image, xp, images, o0, pair0, dw);
    default:
      return tile<OB, kNarrowTileMaxPairs>(d, dy, dy_image, xp, images, o0, pair0, dw);
  }
}

}  // namespace

int64_t weight_dots_scratch_avx512(const WeightDots& d, int64_t images) { return images * pairs_image(d); }

void weight_dots_avx512(const WeightDots& d, const float* dy, int64_t dy_image, const float* const* rows,
                        int64_t images, float* scratch, float* dw) {
  for (int64_t n = 0; n < images; ++n) interleave_pairs(d, rows + n * d.rows, scratch + n * pairs_image(d));
  const bool narrow = pairs_of(d) <= kNarrowTileMaxPairs;
  const int64_t tile_o = narrow ? kNarrowTileO : kTileO, tile_pairs = narrow ? pairs_of(d) : kTilePairs;
  for (int64_t o0 = 0; o0 < d.out_channels; o0 += tile_o)
    for (int64_t pair0 = 0; pair0 < pairs_of(d); pair0 += tile_pairs) {
      const int pb = int(std::min<int64_t>(tile_pairs, pairs_of(d) - pair0));
      switch (std::min<int64_t>(tile_o, d.out_channels - o0)) {
        case 1:
          tile_row<1>(pb, d, dy, dy_image, scratch, images, o0, pair0, dw);
          break;
        case 2:
          tile_row<2>(pb, d, dy, dy_image, scratch, images, o0, pair0, dw);
          break;
        case 3:
          tile_row<3>(pb, d, dy, dy_image, scratch, images, o0, pair0, dw);
          break;
        case 4:
          tile_row<4>(pb, d, dy, dy_image, scratch, images, o0, pair0, dw);
          break;
        case 5:
          tile_row<5>(pb, d, dy, dy_image, scratch, images, o0, pair0, dw);
          break;
        default:
          tile_row<kTileO>(pb, d, dy, dy_image, scratch, images, o0, pair0, dw);
          break;
      }
    }
}

}  // namespace ember::cpu

#include "kernels/cpu/avx512_code_end.inc"
