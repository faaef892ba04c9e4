// The IDX format of MNIST and Fashion-MNIST: a 4-byte magic (two zero bytes, a type code, the
// number of dimensions), the dimensions as big-endian 32-bit integers, then the values in
// row-major order, big-endian. Files may be gzip-compressed (detected from the bytes).
// Every inconsistency (bad magic, unknown type code, a zero or overflowing dimension, a file
// shorter or longer than its header promises, corrupt gzip data) is an ember::Error naming the
// file, so a damaged download never trains on half an array.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ember::data {

enum class IdxType : uint8_t {
  u8 = 0x08,
  i8 = 0x09,
  i16 = 0x0B,
  i32 = 0x0C,
  f32 = 0x0D,
  f64 = 0x0E,
};

const char* idx_type_name(IdxType type);
size_t idx_type_size(IdxType type);

// One IDX array: its type, dimensions and values, converted to this machine's byte order.
struct IdxArray {
  IdxType type = IdxType::u8;
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;  // numel * idx_type_size(type) bytes, host byte order

  int64_t numel() const;
  // The values as a tensor: f32 and f64 keep their type, integers become i64 (Ember has no
  // 8- or 16-bit integer dtype).
  Tensor to_tensor() const;
};

// Reads a whole IDX file (plain or gzip). max_bytes bounds the decompressed payload so that a
// corrupt header cannot ask for an absurd allocation.
IdxArray read_idx(const std::string& path, int64_t max_bytes = int64_t(1) << 32);

// Writes an array in IDX format, gzip-compressed when `gzip` is set (the tests and any user
// exporting data use it).
void write_idx(const std::string& path, const IdxArray& array, bool gzip = false);

}  // namespace ember::data
