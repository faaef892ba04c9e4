// PNG decoding in the order the format lays it out: signature, chunks (length, type, data,
// CRC over type and data), IHDR first, the IDAT chunks concatenated into one zlib stream, IEND
// last. Every scanline starts with a filter byte; filters predict from the decoded bytes to the
// left (a whole pixel back) and above, so rows are undone top to bottom.
#include "png_reader.h"

#include <zlib.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace ember::testing {

namespace {

uint32_t big_endian_u32(const std::string& bytes, size_t at) {
  return uint32_t(uint8_t(bytes[at])) << 24 | uint32_t(uint8_t(bytes[at + 1])) << 16 |
         uint32_t(uint8_t(bytes[at + 2])) << 8 | uint32_t(uint8_t(bytes[at + 3]));
}

uint8_t paeth(int left, int up, int up_left) {
  const int p = left + up - up_left;
  const int pa = std::abs(p - left), pb = std::abs(p - up), pc = std::abs(p - up_left);
  if (pa <= pb && pa <= pc) return uint8_t(left);
  return uint8_t(pb <= pc ? up : up_left);
}

}  // namespace

RgbImage decode_png(const std::string& bytes) {
  static const char kSignature[] = "\x89PNG\r\n\x1a\n";
  EMBER_CHECK(bytes.size() >= 8 && bytes.compare(0, 8, kSignature, 8) == 0, "png: not a PNG file (bad signature)");

  RgbImage image;
  int channels = 0;
  std::string compressed;
  bool seen_header = false, seen_end = false;
  for (size_t at = 8; !seen_end;) {
    EMBER_CHECK(at + 12 <= bytes.size(), "png: chunk header at byte ", at, " runs past the end of the file");
    const uint32_t length = big_endian_u32(bytes, at);
    EMBER_CHECK(length <= bytes.size() - at - 12, "png: chunk at byte ", at, " claims ", length,
                " bytes, more than the file holds");
    const std::string type = bytes.substr(at + 4, 4);
    const std::string data = bytes.substr(at + 8, length);
    const uint32_t stored_crc = big_endian_u32(bytes, at + 8 + length);
    const uLong crc = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data() + at + 4), length + 4);
    EMBER_CHECK(crc == stored_crc, "png: CRC mismatch in chunk ", type, " at byte ", at);
    at += 12 + length;

    if (type == "IHDR") {
      EMBER_CHECK(length == 13, "png: IHDR is ", length, " bytes, expected 13");
      image.width = int(big_endian_u32(data, 0));
      image.height = int(big_endian_u32(data, 4));
      const int bit_depth = uint8_t(data[8]), colour_type = uint8_t(data[9]), interlace = uint8_t(data[12]);
      EMBER_CHECK(bit_depth == 8, "png: bit depth ", bit_depth, " not supported (only 8)");
      EMBER_CHECK(colour_type == 2 || colour_type == 6, "png: colour type ", colour_type,
                  " not supported (only RGB = 2 and RGBA = 6)");
      EMBER_CHECK(interlace == 0, "png: interlaced images are not supported");
      EMBER_CHECK(image.width > 0 && image.height > 0 && image.width <= 1 << 15 && image.height <= 1 << 15,
                  "png: image size ", image.width, "x", image.height, " out of range");
      channels = colour_type == 2 ? 3 : 4;
      seen_header = true;
    } else if (type == "IDAT") {
      EMBER_CHECK(seen_header, "png: IDAT before IHDR");
      compressed += data;
    } else if (type == "IEND") {
      seen_end = true;
    }
  }
  EMBER_CHECK(seen_header, "png: no IHDR chunk");

  const size_t stride = size_t(image.width) * size_t(channels);
  std::vector<uint8_t> raw(size_t(image.height) * (stride + 1));
  uLongf raw_size = uLongf(raw.size());
  const int status = uncompress(raw.data(), &raw_size, reinterpret_cast<const Bytef*>(compressed.data()),
                                uLong(compressed.size()));
  EMBER_CHECK(status == Z_OK, "png: image data does not inflate (zlib status ", status, ")");
  EMBER_CHECK(raw_size == raw.size(), "png: image data inflates to ", raw_size, " bytes, expected ", raw.size());

  std::vector<uint8_t> previous(stride, 0), row(stride);
  image.rgb.resize(size_t(image.width) * size_t(image.height) * 3);
  for (int y = 0; y < image.height; ++y) {
    const uint8_t* line = &raw[size_t(y) * (stride + 1)];
    const int filter = line[0];
    for (size_t i = 0; i < stride; ++i) {
      const int left = i >= size_t(channels) ? row[i - channels] : 0;
      const int up = previous[i];
      const int up_left = i >= size_t(channels) ? previous[i - channels] : 0;
      int predicted = 0;
      switch (filter) {
        case 0: predicted = 0; break;
        case 1: predicted = left; break;
        case 2: predicted = up; break;
        case 3: predicted = (left + up) / 2; break;
        case 4: predicted = paeth(left, up, up_left); break;
        default: EMBER_FAIL("png: row ", y, " has unknown filter type ", filter);
      }
      row[i] = uint8_t(line[1 + i] + predicted);
    }
    for (int x = 0; x < image.width; ++x)
      for (int c = 0; c < 3; ++c) image.rgb[(size_t(y) * size_t(image.width) + size_t(x)) * 3 + c] = row[size_t(x) * channels + c];
    previous.swap(row);
  }
  return image;
}

RgbImage read_png(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EMBER_CHECK(in, "png: cannot open ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return decode_png(ss.str());
}

}  // namespace ember::testing
