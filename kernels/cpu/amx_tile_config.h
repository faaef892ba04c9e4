// AMX tile geometry and the 64-byte tile configuration that LDTILECFG reads (Intel SDM, palette
// 1): eight tile registers of at most 16 rows by 64 bytes. Plain data, shared by the bf16 AMX
// GEMM's packing, its hardware backend and its emulated backend.
#pragma once
#include <cstdint>

namespace ember::cpu::amx {

constexpr int kTileRows = 16;                 // rows of every tile Ember configures
constexpr int kTileRowBytes = 64;             // bytes per tile row
constexpr int kTileBf16 = kTileRows * 32;     // bf16 values in one tile (1 KiB)
constexpr int kTileK = 32;                    // k values per A tile row: 16 pairs
constexpr int kTileCols = 16;                 // f32 columns of a C tile, bf16 pairs of a B tile row

struct alignas(64) TileConfig {
  uint8_t palette_id = 0;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of tile t
  uint8_t rows[16] = {};    // rows of tile t
};
static_assert(sizeof(TileConfig) == 64);

// The register roles of the 2x2 micro-kernel: C(r, c) accumulates rows 16r.. and columns 16c..
// of a 32 x 32 block of C from A tile r and B tile c.
constexpr int kTileC00 = 0, kTileC01 = 1, kTileC10 = 2, kTileC11 = 3;
constexpr int kTileA0 = 4, kTileA1 = 5, kTileB0 = 6, kTileB1 = 7;

// Palette 1 with all eight tiles 16 rows by 64 bytes: every tile the GEMM uses is full-sized,
// the edges of its operands being zero-padded when packed.
inline TileConfig full_tile_config() {
  TileConfig cfg;
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = kTileRows;
    cfg.colsb[t] = kTileRowBytes;
  }
  return cfg;
}

}  // namespace ember::cpu::amx
