// gemm_bf16_amx_emulated_serial (gemm_bf16_amx.h): the AMX GEMM's blocking
// (gemm_bf16_amx_blocking.inc) over tile registers emulated in plain C++, following the Intel
// SDM's descriptions of LDTILECFG, TILELOADD, TILESTORED, TILEZERO, TILERELEASE and TDPBF16PS:
//
//   - a tile load fills rows[t] rows of colsb[t] bytes and zeroes the rest of the register;
//   - tdpbf16ps, for m < rows(C), each k-pair p < colsb(A) / 4 and n < colsb(C) / 4, adds
//     A[m][2p] * B[p][2n], then A[m][2p + 1] * B[p][2n + 1], to C[m][n]: each step one f32
//     fused multiply-add rounded to nearest even, bf16 inputs widened with subnormals read as
//     zero and subnormal results flushed to zero (the Intrinsics Guide's order of the two adds);
//   - shapes tdpbf16ps would fault on (#UD) are an ember::Error, as are tiles used unconfigured.
// Only the tiles' arithmetic is emulated, not their timing.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/aligned_buffer.h"
#include "kernels/cpu/amx_tile_config.h"
#include "kernels/cpu/gemm_bf16_amx.h"
#include "kernels/cpu/gemm_bf16_amx_packing.h"

namespace ember::cpu {
namespace {

class EmulatedTiles {
 public:
  void configure(const amx::TileConfig& cfg) {
    EMBER_CHECK(cfg.palette_id == 1 && cfg.start_row == 0, "emulated ldtilecfg: palette ", int(cfg.palette_id),
                " start_row ", int(cfg.start_row), " (only palette 1 from row 0 is emulated)");
    for (int t = 0; t < 16; ++t) {
      const bool limits = t < kTiles ? cfg.rows[t] <= amx::kTileRows && cfg.colsb[t] <= amx::kTileRowBytes
                                     : cfg.rows[t] == 0 && cfg.colsb[t] == 0;
      EMBER_CHECK(limits, "emulated ldtilecfg: tile ", t, " has ", int(cfg.rows[t]), " rows of ", cfg.colsb[t],
                  " bytes");
    }
    cfg_ = cfg;
    configured_ = true;
    std::memset(data_, 0, sizeof data_);
  }

  void release() {
    cfg_ = amx::TileConfig{};
    configured_ = false;
    std::memset(data_, 0, sizeof data_);
  }

  template <int T>
  void zero() {
    check_configured(T, "tilezero");
    std::memset(data_[T], 0, sizeof data_[T]);
  }

  template <int T>
  void load(const void* base, int64_t stride) {
    check_configured(T, "tileloadd");
    std::memset(data_[T], 0, sizeof data_[T]);
    for (int r = 0; r < cfg_.rows[T]; ++r)
      std::memcpy(data_[T] + r * amx::kTileRowBytes, static_cast<const uint8_t*>(base) + r * stride, cfg_.colsb[T]);
  }

  template <int T>
  void store(void* base, int64_t stride) {
    check_configured(T, "tilestored");
    for (int r = 0; r < cfg_.rows[T]; ++r)
      std::memcpy(static_cast<uint8_t*>(base) + r * stride, data_[T] + r * amx::kTileRowBytes, cfg_.colsb[T]);
  }

  template <int C, int A, int B>
  void dot_bf16() {
    check_configured(C, "tdpbf16ps");
    check_configured(A, "tdpbf16ps");
    check_configured(B, "tdpbf16ps");
    const int c_rows = cfg_.rows[C], c_colsb = cfg_.colsb[C], a_colsb = cfg_.colsb[A];
    EMBER_CHECK(C != A && C != B && A != B && cfg_.rows[A] == c_rows && cfg_.colsb[B] == c_colsb &&
                    a_colsb % 4 == 0 && c_colsb % 4 == 0 && cfg_.rows[B] == a_colsb / 4,
                "emulated tdpbf16ps: tiles ", C, ", ", A, ", ", B, " of shapes ", c_rows, "x", c_colsb, ", ",
                int(cfg_.rows[A]), "x", a_colsb, ", ", int(cfg_.rows[B]), "x", cfg_.colsb[B],
                " would fault (#UD)");
    const int pairs = a_colsb / 4, cols = c_colsb / 4;
    for (int m = 0; m < c_rows; ++m) {
      float row[amx::kTileCols];
      std::memcpy(row, data_[C] + m * amx::kTileRowBytes, size_t(c_colsb));
      for (int p = 0; p < pairs; ++p)
        for (int n = 0; n < cols; ++n)
          for (int half = 0; half < 2; ++half) {
            const float x = bf16_at(A, m, 2 * p + half), y = bf16_at(B, p, 2 * n + half);
            row[n] = flush_subnormal(std::fma(x, y, row[n]));
          }
      // The row is written back whole: bytes past colsb are zero.
      std::memset(data_[C] + m * amx::kTileRowBytes, 0, amx::kTileRowBytes);
      std::memcpy(data_[C] + m * amx::kTileRowBytes, row, size_t(c_colsb));
    }
    for (int m = c_rows; m < amx::kTileRows; ++m) std::memset(data_[C] + m * amx::kTileRowBytes, 0, amx::kTileRowBytes);
  }

 private:
  static constexpr int kTiles = 8;

  void check_configured(int t, const char* op) const {
    EMBER_CHECK(configured_ && t >= 0 && t < kTiles && cfg_.rows[t] > 0 && cfg_.colsb[t] > 0, "emulated ", op,
                ": tile ", t, " is not configured");
  }

  // Value `index` of row `row` of tile t as bf16 widened to f32, a subnormal read as zero.
  float bf16_at(int t, int row, int index) const {
    uint16_t bits;
    std::memcpy(&bits, data_[t] + row * amx::kTileRowBytes + 2 * index, sizeof bits);
    if ((bits & 0x7f80u) == 0) bits &= 0x8000u;
    return std::bit_cast<float>(uint32_t(bits) << 16);
  }

  static float flush_subnormal(float v) { return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v; }

  amx::TileConfig cfg_;
  bool configured_ = false;
  alignas(64) uint8_t data_[kTiles][amx::kTileRows * amx::kTileRowBytes] = {};
};

#include "kernels/cpu/gemm_bf16_amx_blocking.inc"

}  // namespace

void gemm_bf16_amx_emulated_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                   const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta,
                                   float* c, int64_t ldc) {
  EmulatedTiles tiles;
  amx_gemm(tiles, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_bf16_amx_emulated_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                   const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta,
                                   BFloat16* c, int64_t ldc) {
  EmulatedTiles tiles;
  amx_gemm(tiles, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace ember::cpu
