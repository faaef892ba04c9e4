// A PNG decoder for test screenshots: 8-bit RGB or RGBA, not interlaced (what headless
// Chromium writes). Chunks are CRC-checked and the image data inflated with zlib, then the
// five row filters undone. Anything else is refused with ember::Error rather than guessed at.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ember::testing {

struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // row-major, 3 bytes a pixel; alpha, if any, is dropped

  const uint8_t* pixel(int x, int y) const { return &rgb[(size_t(y) * size_t(width) + size_t(x)) * 3]; }
};

RgbImage decode_png(const std::string& bytes);
RgbImage read_png(const std::string& path);

}  // namespace ember::testing
