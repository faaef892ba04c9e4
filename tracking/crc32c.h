// CRC32C (Castagnoli): the checksum TFRecord framing uses for record lengths and payloads.
// Table-driven, one byte at a time: event files are small and written once per log() call, so
// the simple form is fast enough and easy to check against the published test vectors.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ember::tracking {

// Continues a CRC32C over `size` more bytes; crc32c_extend(0, ...) starts a new checksum.
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t size);
inline uint32_t crc32c(std::string_view bytes) { return crc32c_extend(0, bytes.data(), bytes.size()); }

// TFRecord stores checksums rotated and offset so that a CRC of data containing CRCs stays
// well distributed: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t mask_crc32c(uint32_t crc);
inline uint32_t masked_crc32c(std::string_view bytes) { return mask_crc32c(crc32c(bytes)); }

}  // namespace ember::tracking
