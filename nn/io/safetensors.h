// Hugging Face safetensors files (model.safetensors): read and write, compatible with the
// reference `safetensors` package in both directions.
//
// Layout: an 8-byte little-endian header length N, N bytes of UTF-8 JSON
//   {"__metadata__": {"k": "v"}, "name": {"dtype": "F32", "shape": [2, 3],
//    "data_offsets": [begin, end]}, ...}
// then the data buffer; offsets are relative to its start, data is C-ordered little-endian.
//
// Reading validates everything before trusting any size, and refuses a malformed file with an
// ember::Error naming the file and the problem. Like the reference implementation, the tensors
// must tile the data buffer exactly: no gaps, no overlaps, no trailing bytes. Stricter than the
// reference: a key repeated in the header and a BOOL byte other than 0 or 1 are refused.
// As in the reference, unknown fields inside a tensor entry are ignored, a null "__metadata__"
// means none, and a tensor's data need not be aligned in the file (it is copied out).
//
// Writing follows the reference byte for byte: compact JSON with "__metadata__" first, tensors
// ordered by descending dtype alignment and then by name (so every tensor is naturally aligned),
// header padded with spaces to a multiple of 8. Metadata keys are written sorted; an empty
// metadata map writes no "__metadata__" entry.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "core/tensor.h"

namespace ember::nn {

// One tensor as described by the header.
struct SafetensorsEntry {
  DType dtype = DType::f32;
  Shape shape;
  int64_t begin = 0;  // byte offsets within the data buffer, [begin, end)
  int64_t end = 0;
};

struct SafetensorsHeader {
  std::map<std::string, SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
  int64_t data_start = 0;  // file offset of the data buffer: 8 + header length
};

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Reads and validates the header only (the whole file's layout is still checked).
SafetensorsHeader read_safetensors_header(const std::string& path);

// Loads every tensor into fresh CPU memory.
std::map<std::string, Tensor> load_safetensors(const std::string& path);
SafetensorsFile load_safetensors_with_metadata(const std::string& path);
// Elements [first, first + numel) of tensor `name`, flattened in row-major order, as a 1-D
// tensor of its dtype: only those bytes are read (sharded checkpoints read the parts of other
// ranks' files they need). The header is read and the file's layout checked first.
Tensor load_safetensors_range(const std::string& path, const std::string& name, int64_t first, int64_t numel);
// The same with the file's header already read (read_safetensors_header), for many reads of
// one file; a file that has since become shorter raises naming it.
Tensor load_safetensors_range(const std::string& path, const SafetensorsHeader& header, const std::string& name,
                              int64_t first, int64_t numel);

// Writes `tensors` (any device, any strides; copied to contiguous host memory one at a time)
// atomically: a temporary file beside `path`, fsync, rename, fsync of the directory. A write
// error (disk full, ...) raises ember::Error naming `path` and leaves any old file in place.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// The format's dtype code: "F32", "F64", "F16", "BF16", "I32", "I64", "BOOL".
const char* safetensors_dtype_code(DType dtype);

}  // namespace ember::nn
