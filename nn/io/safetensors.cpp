#include "nn/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "core/native/copy.h"
#include "nn/io/atomic_file.h"
#include "nn/io/json_config.h"

namespace ember::nn {

// The format is little-endian and tensors are copied byte for byte.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
constexpr uint64_t kInt64Max = uint64_t(std::numeric_limits<int64_t>::max());

// Every dtype code the format defines, so a file using one Ember lacks gets "not supported"
// rather than "unknown".
constexpr const char* kForeignDtypeCodes[] = {"U8",      "I8",          "U16",         "I16",    "U32",
                                              "U64",     "F8_E5M2",     "F8_E4M3",     "F8_E8M0",
                                              "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4", "F6_E2M3", "F6_E3M2", "C64"};
constexpr DType kEmberDtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                  DType::i32, DType::i64, DType::boolean};

// Position in the reference's dtype enum, which it keeps in increasing alignment order; the
// writer orders tensors by this, descending.
int alignment_rank(DType t) {
  switch (t) {
    case DType::boolean: return 0;
    case DType::f16: return 1;
    case DType::bf16: return 2;
    case DType::i32: return 3;
    case DType::f32: return 4;
    case DType::f64: return 5;
    case DType::i64: return 6;
  }
  return 0;
}

// A value as JSON text for messages, cut short so a hostile header cannot make them huge.
std::string clipped(const json& v) {
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 64) text = text.substr(0, 61) + "...";
  return text;
}

// A tensor name or key for messages, cut short like clipped().
std::string shown(const std::string& name) { return name.size() > 100 ? name.substr(0, 97) + "..." : name; }

// "integer -2", "string \"1\"", ...
std::string describe(const json& v) { return std::string(json_type_name(v)) + " " + clipped(v); }

// Strict UTF-8 (no overlong forms, surrogates or code points past U+10FFFF), as the reference
// checks before parsing. Returns the offset of the first bad byte, or npos.
size_t first_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    if (c < 0x80) { ++i; continue; }
    size_t len;
    uint32_t cp, min;
    if ((c & 0xe0) == 0xc0) { len = 2; cp = c & 0x1f; min = 0x80; }
    else if ((c & 0xf0) == 0xe0) { len = 3; cp = c & 0x0f; min = 0x800; }
    else if ((c & 0xf8) == 0xf0) { len = 4; cp = c & 0x07; min = 0x10000; }
    else return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += len;
  }
  return std::string_view::npos;
}

// A file opened for reading, with every read checked.
class InputFile {
 public:
  InputFile(const std::string& path, const std::string& where) : where_(where) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    EMBER_CHECK(fd_ >= 0, where_, "cannot open: ", std::strerror(errno));
    struct stat st {};
    EMBER_CHECK(::fstat(fd_, &st) == 0, where_, "cannot stat: ", std::strerror(errno));
    EMBER_CHECK(S_ISREG(st.st_mode), where_, "not a regular file");
    size_ = uint64_t(st.st_size);
  }
  ~InputFile() { ::close(fd_); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  uint64_t size() const { return size_; }

  void read_at(void* dst, uint64_t n, uint64_t offset, const std::string& what) const {
    char* p = static_cast<char*>(dst);
    while (n > 0) {
      const ssize_t r = ::pread(fd_, p, size_t(std::min<uint64_t>(n, 1u << 30)), off_t(offset));
      if (r < 0 && errno == EINTR) continue;
      EMBER_CHECK(r >= 0, where_, "error reading ", what, ": ", std::strerror(errno));
      EMBER_CHECK(r > 0, where_, "file ended at byte ", offset, " while reading ", what,
                  " (was it truncated while being read?)");
      p += r;
      n -= uint64_t(r);
      offset += uint64_t(r);
    }
  }

 private:
  std::string where_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// ---- header validation

DType parse_dtype(const json& v, const std::string& where, const std::string& name) {
  EMBER_CHECK(v.is_string(), where, "tensor '", name, "': 'dtype' must be a string, got ", describe(v));
  const std::string code = v.get<std::string>();
  for (DType t : kEmberDtypes)
    if (code == safetensors_dtype_code(t)) return t;
  for (const char* foreign : kForeignDtypeCodes)
    EMBER_CHECK(code != foreign, where, "tensor '", name, "': dtype '", shown(code),
                "' is not supported (Ember reads F32, F64, F16, BF16, I32, I64 and BOOL)");
  EMBER_FAIL(where, "tensor '", name, "': unknown dtype '", shown(code), "'");
}

// A JSON integer in [0, 2^63); anything else is reported through `fail`.
bool as_index(const json& v, uint64_t& out) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) return false;
  out = v.get<uint64_t>();
  return true;
}

Shape parse_shape(const json& v, const std::string& where, const std::string& name, uint64_t& numel) {
  EMBER_CHECK(v.is_array(), where, "tensor '", name, "': 'shape' must be an array of non-negative "
              "integers, got ", describe(v));
  Shape shape;
  uint64_t nonzero_product = 1;
  bool overflow = false, has_zero = false;
  for (size_t i = 0; i < v.size(); ++i) {
    uint64_t d = 0;
    EMBER_CHECK(as_index(v[i], d), where, "tensor '", name, "': shape entry ", i,
                " must be a non-negative integer, got ", describe(v[i]));
    // Zero-sized dims hold no data, but the other dims must still be sizes Ember can index.
    if (d > kInt64Max) overflow = true;
    else if (d == 0) has_zero = true;
    else if (nonzero_product > kInt64Max / d) overflow = true;
    else nonzero_product *= d;
    shape.push_back(int64_t(std::min(d, kInt64Max)));
  }
  EMBER_CHECK(!overflow, where, "tensor '", name, "': shape ", clipped(v),
              " has more elements than a 64-bit count can hold");
  numel = has_zero ? 0 : nonzero_product;
  return shape;
}

const json& required_field(const json& entry, const char* field, const std::string& where,
                           const std::string& name) {
  auto it = entry.find(field);
  EMBER_CHECK(it != entry.end(), where, "tensor '", name, "': missing '", field, "'");
  return *it;
}

void parse_metadata(const json& v, const std::string& where, std::map<std::string, std::string>& out) {
  if (v.is_null()) return;
  EMBER_CHECK(v.is_object(), where, "'__metadata__' must be an object of strings, got ", describe(v));
  for (const auto& [key, value] : v.items()) {
    EMBER_CHECK(value.is_string(), where, "'__metadata__' field '", shown(key), "' must be a string, got ",
                describe(value));
    out.emplace(key, value.get<std::string>());
  }
}

SafetensorsHeader parse_header(std::string_view text, uint64_t buffer_bytes, const std::string& where) {
  const size_t bad = first_invalid_utf8(text);
  EMBER_CHECK(bad == std::string_view::npos, where, "header is not valid UTF-8 (byte ", bad, " of the header)");
  const json root = parse_json(text, where + "header");
  EMBER_CHECK(root.is_object(), where, "header must be a JSON object, got ", json_type_name(root));

  SafetensorsHeader header;
  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") {
      parse_metadata(entry, where, header.metadata);
      continue;
    }
    const std::string label = shown(name);
    EMBER_CHECK(entry.is_object(), where, "tensor '", label, "': entry must be an object, got ", describe(entry));
    SafetensorsEntry e;
    e.dtype = parse_dtype(required_field(entry, "dtype", where, label), where, label);
    uint64_t numel = 0;
    e.shape = parse_shape(required_field(entry, "shape", where, label), where, label, numel);
    const uint64_t elem = dtype_size(e.dtype);
    EMBER_CHECK(numel <= kInt64Max / elem, where, "tensor '", label, "': shape ", e.shape, " of ",
                safetensors_dtype_code(e.dtype), " needs more bytes than a 64-bit count can hold");
    const uint64_t nbytes = numel * elem;

    const json& offsets = required_field(entry, "data_offsets", where, label);
    uint64_t begin = 0, end = 0;
    EMBER_CHECK(offsets.is_array() && offsets.size() == 2 && as_index(offsets[0], begin) &&
                    as_index(offsets[1], end),
                where, "tensor '", label, "': 'data_offsets' must be [begin, end] with non-negative "
                "integers, got ", describe(offsets));
    EMBER_CHECK(begin <= end, where, "tensor '", label, "': data_offsets [", begin, ", ", end,
                "] have begin > end");
    EMBER_CHECK(end - begin == nbytes, where, "tensor '", label, "': data_offsets [", begin, ", ", end,
                "] span ", end - begin, " bytes but shape ", e.shape, " of ", safetensors_dtype_code(e.dtype),
                " needs ", nbytes, " bytes");
    EMBER_CHECK(end <= buffer_bytes, where, "tensor '", label, "': data_offsets [", begin, ", ", end,
                "] run past the end of the data buffer (", buffer_bytes, " bytes)");
    e.begin = int64_t(begin);
    e.end = int64_t(end);
    header.tensors.emplace(name, std::move(e));
  }

  // The reference requires the tensors, in offset order, to tile the buffer exactly: each
  // starts where the previous one ended and the last ends at the end of the file.
  std::vector<std::pair<const std::string*, const SafetensorsEntry*>> order;
  for (const auto& [name, e] : header.tensors) order.emplace_back(&name, &e);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::tie(a.second->begin, a.second->end) < std::tie(b.second->begin, b.second->end);
  });
  int64_t covered = 0;
  const std::string* previous = nullptr;
  for (const auto& [name, e] : order) {
    EMBER_CHECK(e->begin >= covered, where, "tensors '", shown(*previous), "' and '", shown(*name), "' overlap: '",
                shown(*name), "' starts at byte ", e->begin, " before '", shown(*previous), "' ends at byte ", covered);
    EMBER_CHECK(e->begin == covered, where, "bytes [", covered, ", ", e->begin, ") of the data buffer belong "
                "to no tensor (gap before '", shown(*name), "'); safetensors requires tensors to cover the buffer "
                "without gaps");
    covered = e->end;
    previous = name;
  }
  EMBER_CHECK(uint64_t(covered) == buffer_bytes, where, "the data buffer has ", buffer_bytes - uint64_t(covered),
              " bytes after the last tensor (bytes [", covered, ", ", buffer_bytes, ") belong to no tensor); "
              "safetensors requires tensors to cover the buffer exactly");
  return header;
}

std::string load_where(const std::string& path) { return "load_safetensors: " + path + ": "; }

SafetensorsHeader read_header(const InputFile& file, const std::string& where) {
  const uint64_t size = file.size();
  EMBER_CHECK(size >= 8, where, "file is ", size, " bytes, too short for the 8-byte header length");
  unsigned char len_bytes[8];
  file.read_at(len_bytes, 8, 0, "the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  EMBER_CHECK(n <= kMaxHeaderBytes, where, "header length ", n, " is larger than the ", kMaxHeaderBytes,
              "-byte limit (corrupt file?)");
  EMBER_CHECK(n <= size - 8, where, "header length ", n, " runs past the end of the file (", size, " bytes)");
  std::string text(n, '\0');
  file.read_at(text.data(), n, 8, "the header");
  SafetensorsHeader header = parse_header(text, size - 8 - n, where);
  header.data_start = int64_t(8 + n);
  return header;
}

void check_bool_bytes(const Tensor& t, const std::string& where, const std::string& name) {
  const auto* p = static_cast<const unsigned char*>(t.raw_data());
  for (int64_t i = 0, n = t.numel(); i < n; ++i)
    EMBER_CHECK(p[i] <= 1, where, "tensor '", shown(name), "': BOOL element ", i, " has byte value ", int(p[i]),
                " (must be 0 or 1)");
}

}  // namespace

const char* safetensors_dtype_code(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::boolean: return "BOOL";
  }
  EMBER_FAIL("safetensors: dtype ", dtype_name(dtype), " has no safetensors code");
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  const std::string where = load_where(path);
  InputFile file(path, where);
  return read_header(file, where);
}

SafetensorsFile load_safetensors_with_metadata(const std::string& path) {
  const std::string where = load_where(path);
  InputFile file(path, where);
  SafetensorsHeader header = read_header(file, where);
  SafetensorsFile out;
  // Every size below was checked against the file size, so allocation and reads are bounded.
  for (const auto& [name, e] : header.tensors) {
    Tensor t = make_tensor(e.shape, e.dtype, Device::cpu());
    const uint64_t nbytes = uint64_t(e.end - e.begin);
    if (nbytes) file.read_at(t.raw_data(), nbytes, uint64_t(header.data_start + e.begin), "tensor '" + shown(name) + "'");
    if (e.dtype == DType::boolean) check_bool_bytes(t, where, name);
    out.tensors.emplace(name, std::move(t));
  }
  out.metadata = std::move(header.metadata);
  return out;
}

Tensor load_safetensors_range(const std::string& path, const std::string& name, int64_t first, int64_t numel) {
  return load_safetensors_range(path, read_safetensors_header(path), name, first, numel);
}

Tensor load_safetensors_range(const std::string& path, const SafetensorsHeader& header, const std::string& name,
                              int64_t first, int64_t numel) {
  const std::string where = load_where(path);
  InputFile file(path, where);
  const auto it = header.tensors.find(name);
  EMBER_CHECK(it != header.tensors.end(), where, "no tensor '", shown(name), "'");
  const SafetensorsEntry& e = it->second;
  const int64_t total = numel_of(e.shape);
  EMBER_CHECK(first >= 0 && numel >= 0 && first <= total && numel <= total - first, where, "tensor '", shown(name),
              "' has ", total, " elements; elements [", first, ", ", first + numel, ") were asked for");
  Tensor t = make_tensor({numel}, e.dtype, Device::cpu());
  const uint64_t elem = uint64_t(dtype_size(e.dtype));
  if (numel)
    file.read_at(t.raw_data(), uint64_t(numel) * elem, uint64_t(header.data_start + e.begin) + uint64_t(first) * elem,
                 "tensor '" + shown(name) + "'");
  if (e.dtype == DType::boolean) check_bool_bytes(t, where, name);
  return t;
}

std::map<std::string, Tensor> load_safetensors(const std::string& path) {
  return load_safetensors_with_metadata(path).tensors;
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string where = "save_safetensors: " + path + ": ";
  std::vector<std::pair<const std::string*, const Tensor*>> order;
  for (const auto& [name, t] : tensors) {
    EMBER_CHECK(t.defined(), where, "tensor '", name, "' is undefined");
    EMBER_CHECK(name != "__metadata__", where, "'__metadata__' is reserved and cannot name a tensor");
    order.emplace_back(&name, &t);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return alignment_rank(a.second->dtype()) > alignment_rank(b.second->dtype());
  });  // names stay sorted within a dtype: the map iterates in name order

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : order) {
    const uint64_t nbytes = uint64_t(t->numel()) * t->element_size();
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = safetensors_dtype_code(t->dtype());
    entry["shape"] = t->shape();
    entry["data_offsets"] = {offset, offset + nbytes};
    header[*name] = std::move(entry);
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception&) {
    EMBER_FAIL(where, "a tensor name or metadata string is not valid UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data buffer 8-byte aligned
  EMBER_CHECK(text.size() <= kMaxHeaderBytes, where, "the header would be ", text.size(), " bytes, more than the ",
              kMaxHeaderBytes, " that safetensors readers accept (too many or too long tensor names?)");
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = uint8_t(uint64_t(text.size()) >> (8 * i));

  try {
    AtomicFile file(path);
    file.write(len_bytes, 8);
    file.write(text);
    for (const auto& [name, t] : order) {
      // One tensor at a time on the host keeps peak memory at the largest tensor.
      const Tensor host = native::contiguous(native::to_device(t->detach(), Device::cpu()));
      file.write(host.raw_data(), size_t(host.numel()) * host.element_size());
    }
    file.commit();
  } catch (const Error& e) {
    throw Error(std::string("save_safetensors: ") + e.what());
  }
}

}  // namespace ember::nn
