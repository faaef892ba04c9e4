#include "data/idx_file.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/factory.h"
#include "data/text_io.h"

namespace ember::data {

const char* idx_type_name(IdxType type) {
  switch (type) {
    case IdxType::u8: return "unsigned byte";
    case IdxType::i8: return "signed byte";
    case IdxType::i16: return "short";
    case IdxType::i32: return "int";
    case IdxType::f32: return "float";
    case IdxType::f64: return "double";
  }
  return "unknown";
}

size_t idx_type_size(IdxType type) {
  switch (type) {
    case IdxType::u8:
    case IdxType::i8: return 1;
    case IdxType::i16: return 2;
    case IdxType::i32:
    case IdxType::f32: return 4;
    case IdxType::f64: return 8;
  }
  return 0;
}

namespace {

bool known_type(uint8_t code) {
  return code == 0x08 || code == 0x09 || code == 0x0B || code == 0x0C || code == 0x0D || code == 0x0E;
}

// zlib's gzFile reads gzip streams and, transparently, plain files.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    handle_ = gzopen(path.c_str(), "rb");
    EMBER_CHECK(handle_ != nullptr, "read_idx: cannot open '", path, "': ", std::strerror(errno));
    gzbuffer(handle_, 1 << 18);
  }
  ~GzReader() {
    if (handle_) gzclose(handle_);
  }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to n bytes; returns how many were read (fewer only at the end of the data).
  size_t read(void* dst, size_t n) {
    size_t done = 0;
    while (done < n) {
      unsigned chunk = unsigned(std::min<size_t>(n - done, size_t(1) << 30));
      int got = gzread(handle_, static_cast<char*>(dst) + done, chunk);
      if (got < 0) {
        int err = 0;
        const char* msg = gzerror(handle_, &err);
        EMBER_FAIL("read_idx: cannot read '", path_, "' (corrupt gzip data?): ", msg);
      }
      if (got == 0) {
        int err = 0;
        gzerror(handle_, &err);
        EMBER_CHECK(err == Z_OK, "read_idx: '", path_, "' is truncated (the gzip stream ends early)");
        break;
      }
      done += size_t(got);
    }
    return done;
  }

 private:
  std::string path_;
  gzFile handle_ = nullptr;
};

void swap_to_host_order(std::vector<uint8_t>& bytes, size_t width) {
  if (width == 1) return;
  uint16_t probe = 1;
  bool little_endian = *reinterpret_cast<uint8_t*>(&probe) == 1;
  if (!little_endian) return;  // IDX is big-endian already
  for (size_t i = 0; i + width <= bytes.size(); i += width)
    for (size_t a = 0, b = width - 1; a < b; ++a, --b) std::swap(bytes[i + a], bytes[i + b]);
}

uint32_t read_be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace

int64_t IdxArray::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

Tensor IdxArray::to_tensor() const {
  Shape shape(dims.begin(), dims.end());
  int64_t n = numel();
  EMBER_CHECK(int64_t(bytes.size()) == n * int64_t(idx_type_size(type)), "IdxArray::to_tensor: ",
              bytes.size(), " bytes do not hold ", dims_text(dims), " values of type ", idx_type_name(type));
  if (type == IdxType::f32 || type == IdxType::f64) {
    Tensor t = empty(shape, {type == IdxType::f32 ? DType::f32 : DType::f64});
    if (n > 0) std::memcpy(t.raw_data(), bytes.data(), bytes.size());  // an empty tensor has no data pointer
    return t;
  }
  Tensor t = empty(shape, {DType::i64});
  int64_t* out = t.data_ptr<int64_t>();
  const uint8_t* src = bytes.data();
  for (int64_t i = 0; i < n; ++i) {
    switch (type) {
      case IdxType::u8: out[i] = src[i]; break;
      case IdxType::i8: out[i] = int8_t(src[i]); break;
      case IdxType::i16: { int16_t v; std::memcpy(&v, src + 2 * i, 2); out[i] = v; break; }
      case IdxType::i32: { int32_t v; std::memcpy(&v, src + 4 * i, 4); out[i] = v; break; }
      default: break;
    }
  }
  return t;
}

IdxArray read_idx(const std::string& path, int64_t max_bytes) {
  GzReader in(path);
  uint8_t magic[4];
  size_t got = in.read(magic, 4);
  EMBER_CHECK(got == 4, "read_idx: '", path, "' is too short for an IDX header (", got, " bytes)");
  EMBER_CHECK(magic[0] == 0 && magic[1] == 0, "read_idx: '", path,
              "' is not an IDX file (its first two bytes are not zero)");
  EMBER_CHECK(known_type(magic[2]), "read_idx: '", path, "' has unknown IDX type code 0x", std::hex,
              int(magic[2]));
  int ndims = magic[3];
  EMBER_CHECK(ndims >= 1, "read_idx: '", path, "' declares 0 dimensions");

  IdxArray array;
  array.type = IdxType(magic[2]);
  std::vector<uint8_t> header(size_t(ndims) * 4);
  got = in.read(header.data(), header.size());
  EMBER_CHECK(got == header.size(), "read_idx: '", path, "' ends inside its header (", ndims,
              " dimensions declared)");
  const int64_t width = int64_t(idx_type_size(array.type));
  int64_t payload = width;
  for (int i = 0; i < ndims; ++i) {
    uint32_t d = read_be32(header.data() + 4 * i);
    array.dims.push_back(int64_t(d));
    EMBER_CHECK(d <= uint32_t(std::numeric_limits<int32_t>::max()) && (d == 0 || payload <= max_bytes / int64_t(d)),
                "read_idx: '", path, "' declares dimensions ", dims_text(array.dims),
                "... whose data would exceed ", max_bytes, " bytes");
    payload *= int64_t(d);
  }
  array.bytes.resize(size_t(payload));
  got = in.read(array.bytes.data(), array.bytes.size());
  EMBER_CHECK(int64_t(got) == payload, "read_idx: '", path, "' is truncated: dimensions ",
              dims_text(array.dims), " of ", idx_type_name(array.type), " need ", payload,
              " data bytes, the file has ", got);
  uint8_t extra;
  EMBER_CHECK(in.read(&extra, 1) == 0, "read_idx: '", path, "' has bytes after the ", payload,
              " data bytes its dimensions ", dims_text(array.dims), " declare");
  swap_to_host_order(array.bytes, size_t(width));
  return array;
}

void write_idx(const std::string& path, const IdxArray& array, bool gzip) {
  EMBER_CHECK(!array.dims.empty() && array.dims.size() <= 255, "write_idx: '", path, "': ",
              array.dims.size(), " dimensions (IDX allows 1 to 255)");
  const size_t width = idx_type_size(array.type);
  EMBER_CHECK(array.bytes.size() == size_t(array.numel()) * width, "write_idx: '", path, "': ",
              array.bytes.size(), " bytes do not hold ", dims_text(array.dims), " values of type ",
              idx_type_name(array.type));
  std::vector<uint8_t> out = {0, 0, uint8_t(array.type), uint8_t(array.dims.size())};
  for (int64_t d : array.dims) {
    EMBER_CHECK(d >= 0 && d <= std::numeric_limits<int32_t>::max(), "write_idx: '", path,
                "': dimension ", d, " does not fit IDX's 32-bit sizes");
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(uint8_t(uint32_t(d) >> shift));
  }
  std::vector<uint8_t> payload = array.bytes;
  swap_to_host_order(payload, width);  // the same swap turns host order into big-endian
  out.insert(out.end(), payload.begin(), payload.end());

  // The bytes go out through the text writer, which already does plain and gzip files.
  write_text_file(path, std::string_view(reinterpret_cast<const char*>(out.data()), out.size()), gzip);
}

}  // namespace ember::data
