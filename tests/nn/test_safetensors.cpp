// safetensors I/O: bit-exact interop with the reference package (golden files made by
// tests/golden/make_safetensors_golden.py), round trips of every dtype and layout, atomic and
// failing writes, and a catalogue of malformed files, one test per problem.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/device_api.h"
#include "nn/io/atomic_file.h"
#include "nn/io/safetensors.h"
#include "test_util.h"

using namespace ember;
using namespace ember::nn;
using ember::testing::random_tensor;
using ember::testing::TempDir;
using Json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return s;
}

// A file from header text and data; the length field is the true header length unless `claimed`.
std::string st_file(const std::string& header, const std::string& data = "",
                    std::optional<uint64_t> claimed = std::nullopt) {
  return le64(claimed ? *claimed : header.size()) + header + data;
}

std::string tensor_bytes(const Tensor& t) {
  Tensor c = t.to(Device::cpu()).contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), size_t(c.numel()) * c.element_size());
}

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string golden_dir() { return std::string(EMBER_SOURCE_DIR) + "/tests/golden/safetensors"; }

Json golden_expected() {
  return Json::parse(read_bytes(golden_dir() + "/expected.json"));
}

// Element values as the golden JSON writes them: non-finite floats as strings.
Json json_values(const Tensor& t) {
  Json out = Json::array();
  if (t.dtype() == DType::boolean) {
    for (bool b : t.to_vector<bool>()) out.push_back(b);
  } else if (is_integral(t.dtype())) {
    for (int64_t v : t.to_vector<int64_t>()) out.push_back(v);
  } else {
    for (double v : t.to_vector<double>()) {
      if (std::isnan(v)) out.push_back("nan");
      else if (std::isinf(v)) out.push_back(v > 0 ? "inf" : "-inf");
      else out.push_back(v);
    }
  }
  return out;
}

// Compares values exactly, including the sign of zero.
::testing::AssertionResult same_values(const Json& actual, const Json& expected) {
  if (actual.size() != expected.size())
    return ::testing::AssertionFailure() << actual.size() << " values, expected " << expected.size();
  for (size_t i = 0; i < actual.size(); ++i) {
    const Json &a = actual[i], &e = expected[i];
    bool same = a == e;
    if (same && a.is_number_float()) same = std::signbit(a.get<double>()) == std::signbit(e.get<double>());
    if (!same) return ::testing::AssertionFailure() << "value " << i << ": " << a.dump() << " != " << e.dump();
  }
  return ::testing::AssertionSuccess();
}

Json describe_tensor(const Tensor& t) {
  return {{"dtype", safetensors_dtype_code(t.dtype())}, {"shape", t.shape()}, {"hex", to_hex(tensor_bytes(t))},
          {"values", json_values(t)}};
}

const std::vector<DType> kAllDtypes = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                       DType::i32, DType::i64, DType::boolean};

Tensor sample(const Shape& shape, DType dtype, bool non_contiguous) {
  const double range = is_floating(dtype) ? 3.0 : 1e6;
  return random_tensor(shape, dtype, non_contiguous, -range, range);
}

}  // namespace

// ---------------------------------------------------------------- golden files (reference-written)

TEST(SafetensorsGolden, LoadBitExactly) {
  const Json expected = golden_expected();
  ASSERT_EQ(expected["files"].size(), 5u);
  for (const auto& [fname, want] : expected["files"].items()) {
    SCOPED_TRACE(fname);
    SafetensorsFile f = load_safetensors_with_metadata(golden_dir() + "/" + fname);
    EXPECT_EQ(Json(f.metadata), want["metadata"]);
    ASSERT_EQ(f.tensors.size(), want["tensors"].size());
    for (const auto& [name, w] : want["tensors"].items()) {
      SCOPED_TRACE(name);
      ASSERT_TRUE(f.tensors.count(name));
      const Tensor& t = f.tensors.at(name);
      EXPECT_EQ(safetensors_dtype_code(t.dtype()), w["dtype"].get<std::string>());
      EXPECT_EQ(t.shape(), w["shape"].get<Shape>());
      EXPECT_TRUE(t.is_cpu() && t.is_contiguous());
      EXPECT_EQ(to_hex(tensor_bytes(t)), w["hex"].get<std::string>());
      EXPECT_TRUE(same_values(json_values(t), w["values"]));
    }
  }
}

TEST(SafetensorsGolden, RewriteIsByteIdenticalToReference) {
  TempDir dir{"ember_safetensors"};
  int checked = 0;
  const Json expected = golden_expected();
  for (const auto& [fname, want] : expected["files"].items()) {
    if (!want["byte_identical"].get<bool>()) continue;
    SCOPED_TRACE(fname);
    const std::string golden = golden_dir() + "/" + fname;
    SafetensorsFile f = load_safetensors_with_metadata(golden);
    save_safetensors(dir.file(fname), f.tensors, f.metadata);
    EXPECT_EQ(to_hex(read_bytes(dir.file(fname))), to_hex(read_bytes(golden)));
    ++checked;
  }
  EXPECT_EQ(checked, 4);
}

TEST(SafetensorsGolden, HeaderDescribesLayout) {
  SafetensorsHeader h = read_safetensors_header(golden_dir() + "/mixed.safetensors");
  EXPECT_EQ(h.metadata, (std::map<std::string, std::string>{{"format", "np"}}));
  EXPECT_EQ(h.data_start % 8, 0);
  ASSERT_EQ(h.tensors.size(), 6u);
  // The reference orders by descending alignment: i64 first, then f64, f32, i32, bool.
  EXPECT_EQ(h.tensors.at("ids").begin, 0);
  EXPECT_EQ(h.tensors.at("ids").end, 40);
  EXPECT_EQ(h.tensors.at("doubles").begin, 40);
  EXPECT_EQ(h.tensors.at("empty").shape, (Shape{0, 3}));
  EXPECT_EQ(h.tensors.at("empty").begin, h.tensors.at("empty").end);
  EXPECT_EQ(h.tensors.at("mask").dtype, DType::boolean);
  EXPECT_EQ(h.tensors.at("mask").end, int64_t(fs::file_size(golden_dir() + "/mixed.safetensors")) - h.data_start);
}

// Writes files for `make_safetensors_golden.py --verify DIR` (DIR from EMBER_SAFETENSORS_EXPORT_DIR,
// else a temporary directory) and checks them here too.
TEST(SafetensorsGolden, ExportForPythonVerify) {
  TempDir scratch{"ember_safetensors"};
  const char* env = std::getenv("EMBER_SAFETENSORS_EXPORT_DIR");
  const std::string out = env && *env ? std::string(env) : scratch.path();
  fs::create_directories(out);
  Json manifest = {{"files", Json::object()}};
  auto record = [&](const std::string& fname, const std::map<std::string, Tensor>& tensors,
                    const std::map<std::string, std::string>& metadata, const std::string& same_as) {
    save_safetensors(out + "/" + fname, tensors, metadata);
    Json entry = {{"metadata", metadata}, {"tensors", Json::object()}};
    for (const auto& [name, t] : tensors) entry["tensors"][name] = describe_tensor(t);
    if (!same_as.empty()) entry["same_bytes_as"] = same_as;
    manifest["files"][fname] = entry;
  };
  const Json expected = golden_expected();
  for (const auto& [fname, want] : expected["files"].items()) {
    SafetensorsFile f = load_safetensors_with_metadata(golden_dir() + "/" + fname);
    record("rewritten_" + fname, f.tensors, f.metadata, want["byte_identical"].get<bool>() ? fname : "");
  }
  std::map<std::string, Tensor> all;
  for (DType dt : kAllDtypes) {
    all[std::string("contiguous.") + dtype_name(dt)] = sample({3, 5}, dt, false);
    all[std::string("strided.") + dtype_name(dt)] = sample({4, 3, 2}, dt, true);
  }
  all["scalar"] = full({}, 0.25);
  all["zero_size"] = zeros({2, 0, 3}, {DType::i32});
  record("all_dtypes.safetensors", all, {{"format", "pt"}, {"written_by", "ember"}, {"text", "ü ✓ \"q\""}}, "");
  write_bytes(out + "/manifest.json", manifest.dump(1));

  for (const auto& [fname, want] : manifest["files"].items()) {
    SCOPED_TRACE(fname);
    SafetensorsFile f = load_safetensors_with_metadata(out + "/" + fname);
    EXPECT_EQ(Json(f.metadata), want["metadata"]);
    for (const auto& [name, w] : want["tensors"].items()) EXPECT_EQ(describe_tensor(f.tensors.at(name)), w) << name;
  }
}

// ---------------------------------------------------------------- round trips

TEST(SafetensorsRoundTrip, EveryDtypeContiguousAndStrided) {
  TempDir dir{"ember_safetensors"};
  for (DType dt : kAllDtypes) {
    for (bool strided : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (strided ? " strided" : " contiguous"));
      std::map<std::string, Tensor> in = {
          {"a", sample({3, 4}, dt, strided)},
          {"b", sample({2, 3, 5}, dt, strided)},
          {"empty", sample({0, 4}, dt, strided)},
          {"scalar", sample({}, dt, false)},
      };
      if (strided) {
        EXPECT_FALSE(in["a"].is_contiguous());
      }
      save_safetensors(dir.file("t.safetensors"), in);
      auto out = load_safetensors(dir.file("t.safetensors"));
      ASSERT_EQ(out.size(), in.size());
      for (const auto& [name, t] : in) {
        const Tensor& r = out.at(name);
        EXPECT_EQ(r.dtype(), dt) << name;
        EXPECT_EQ(r.shape(), t.shape()) << name;
        EXPECT_EQ(to_hex(tensor_bytes(r)), to_hex(tensor_bytes(t))) << name;
      }
    }
  }
}

TEST(SafetensorsRoundTrip, ViewsAreWrittenInLogicalOrder) {
  TempDir dir{"ember_safetensors"};
  Tensor base = arange(12, {DType::f32}).view({3, 4});
  std::map<std::string, Tensor> in = {
      {"transposed", base.t()},                                           // strides [1, 4]
      {"narrowed", base.narrow(1, 1, 2)},                                 // storage offset 1
      {"expanded", from_vector<float>({5, 6}).view({2, 1}).expand({2, 3})},  // stride 0
      {"selected", base.select(0, 2)},
  };
  save_safetensors(dir.file("v.safetensors"), in);
  auto out = load_safetensors(dir.file("v.safetensors"));
  EXPECT_EQ(out.at("transposed").to_vector<float>(), (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_EQ(out.at("transposed").shape(), (Shape{4, 3}));
  EXPECT_EQ(out.at("narrowed").to_vector<float>(), (std::vector<float>{1, 2, 5, 6, 9, 10}));
  EXPECT_EQ(out.at("expanded").to_vector<float>(), (std::vector<float>{5, 5, 5, 6, 6, 6}));
  EXPECT_EQ(out.at("selected").to_vector<float>(), (std::vector<float>{8, 9, 10, 11}));
  // The source tensors are untouched and the loaded ones own their memory.
  EXPECT_EQ(base.to_vector<float>()[5], 5.0f);
  out.at("transposed").fill_(0.0);
  EXPECT_EQ(base.to_vector<float>()[4], 4.0f);
}

TEST(SafetensorsRoundTrip, TensorsThatRequireGradAndSharedStorage) {
  TempDir dir{"ember_safetensors"};
  Tensor w = random_tensor({4, 4}).requires_grad_();
  std::map<std::string, Tensor> in = {{"w", w}, {"tied", w}, {"row", w.select(0, 1)}};
  save_safetensors(dir.file("g.safetensors"), in);
  auto out = load_safetensors(dir.file("g.safetensors"));
  EXPECT_EQ(tensor_bytes(out.at("w")), tensor_bytes(w));
  EXPECT_EQ(tensor_bytes(out.at("tied")), tensor_bytes(w));
  EXPECT_EQ(tensor_bytes(out.at("row")), tensor_bytes(w.select(0, 1)));
  EXPECT_FALSE(out.at("w").requires_grad());
}

TEST(SafetensorsRoundTrip, Metadata) {
  TempDir dir{"ember_safetensors"};
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"empty", ""}, {"unicode ✓", "välue \"quoted\"\n\ttab"}, {"__metadata__", "x"}};
  save_safetensors(dir.file("m.safetensors"), {{"x", ones({2})}}, meta);
  SafetensorsFile f = load_safetensors_with_metadata(dir.file("m.safetensors"));
  EXPECT_EQ(f.metadata, meta);
  EXPECT_EQ(f.tensors.at("x").to_vector<float>(), (std::vector<float>{1, 1}));

  // No metadata: no "__metadata__" entry at all, as the reference writes it.
  save_safetensors(dir.file("n.safetensors"), {{"x", ones({2})}});
  EXPECT_EQ(read_bytes(dir.file("n.safetensors")).find("__metadata__"), std::string::npos);
  EXPECT_TRUE(load_safetensors_with_metadata(dir.file("n.safetensors")).metadata.empty());
}

TEST(SafetensorsRoundTrip, CudaTensorsAreCopiedToHost) {
  if (!cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  TempDir dir{"ember_safetensors"};
  Tensor host = random_tensor({5, 7});
  Tensor dev = host.to(Device::cuda());
  save_safetensors(dir.file("c.safetensors"), {{"d", dev}, {"dt", dev.t()}});
  auto out = load_safetensors(dir.file("c.safetensors"));
  EXPECT_TRUE(out.at("d").is_cpu());
  EXPECT_EQ(tensor_bytes(out.at("d")), tensor_bytes(host));
  EXPECT_EQ(tensor_bytes(out.at("dt")), tensor_bytes(host.t()));
}

// ---------------------------------------------------------------- writer layout

TEST(SafetensorsWriter, MatchesReferenceBytesForKnownExamples) {
  TempDir dir{"ember_safetensors"};
  // The reference's own serialization tests: an empty file, with and without metadata.
  save_safetensors(dir.file("e.safetensors"), {});
  EXPECT_EQ(read_bytes(dir.file("e.safetensors")), le64(8) + "{}      ");
  save_safetensors(dir.file("m.safetensors"), {}, {{"framework", "pt"}});
  EXPECT_EQ(read_bytes(dir.file("m.safetensors")), le64(40) + "{\"__metadata__\":{\"framework\":\"pt\"}}     ");
  // One f32 tensor [1, 2, 3] holding 0..5; header exactly 64 bytes, so no padding.
  save_safetensors(dir.file("a.safetensors"), {{"attn.0", arange(0, 6, 1, {DType::f32}).view({1, 2, 3})}});
  const std::string header = "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}";
  ASSERT_EQ(header.size(), 64u);
  const float values[6] = {0, 1, 2, 3, 4, 5};
  EXPECT_EQ(read_bytes(dir.file("a.safetensors")),
            le64(64) + header + std::string(reinterpret_cast<const char*>(values), sizeof values));
}

TEST(SafetensorsWriter, OrdersByAlignmentThenNameAndAlignsEveryTensor) {
  TempDir dir{"ember_safetensors"};
  std::map<std::string, Tensor> in;
  const char* names[] = {"z", "a", "m"};  // written out of order; expected back sorted
  const char* sorted_names[] = {"a", "m", "z"};
  for (DType dt : kAllDtypes)
    for (const char* n : names) in[std::string(n) + "." + dtype_name(dt)] = sample({3}, dt, false);
  save_safetensors(dir.file("o.safetensors"), in);
  SafetensorsHeader h = read_safetensors_header(dir.file("o.safetensors"));
  EXPECT_EQ(h.data_start % 8, 0);
  std::vector<std::pair<int64_t, std::string>> by_offset;
  for (const auto& [name, e] : h.tensors) {
    EXPECT_EQ(e.begin % int64_t(dtype_size(e.dtype)), 0) << name << " is misaligned";
    by_offset.emplace_back(e.begin, name);
  }
  std::sort(by_offset.begin(), by_offset.end());
  std::vector<std::string> order;
  for (const auto& p : by_offset) order.push_back(p.second);
  std::vector<std::string> want;
  for (DType dt : {DType::i64, DType::f64, DType::f32, DType::i32, DType::bf16, DType::f16, DType::boolean})
    for (const char* n : sorted_names) want.push_back(std::string(n) + "." + dtype_name(dt));
  EXPECT_EQ(order, want);
}

TEST(SafetensorsWriter, HeaderIsPaddedWithSpacesToEightBytes) {
  TempDir dir{"ember_safetensors"};
  for (int len = 1; len <= 9; ++len) {
    const std::string name(size_t(len), 'n');
    save_safetensors(dir.file("p.safetensors"), {{name, ones({1})}});
    const std::string bytes = read_bytes(dir.file("p.safetensors"));
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[size_t(i)]);
    EXPECT_EQ(n % 8, 0u);
    const std::string text = bytes.substr(8, n);
    const size_t close = text.find_last_of('}');
    EXPECT_LT(n - close - 1, 8u);
    EXPECT_EQ(text.find_first_not_of(' ', close + 1), std::string::npos);
    EXPECT_EQ(bytes.size(), 8 + n + 4);
  }
}

TEST(SafetensorsWriter, RefusesWhatCannotBeWritten) {
  TempDir dir{"ember_safetensors"};
  const std::string p = dir.file("r.safetensors");
  EXPECT_EMBER_ERROR(save_safetensors(p, {{"x", Tensor()}}), "save_safetensors", p, "tensor 'x' is undefined");
  EXPECT_EMBER_ERROR(save_safetensors(p, {{"__metadata__", ones({1})}}), p, "'__metadata__' is reserved");
  EXPECT_EMBER_ERROR(save_safetensors(p, {{"bad\xff", ones({1})}}), p, "not valid UTF-8");
  EXPECT_EMBER_ERROR(save_safetensors(p, {}, {{"k", "\xc3"}}), p, "not valid UTF-8");
  EXPECT_FALSE(fs::exists(p));
  EXPECT_TRUE(dir.names().empty());
}

// ---------------------------------------------------------------- atomic writes and write errors

TEST(SafetensorsAtomicWrite, ReplacesExistingFileAndLeavesNoTemporaries) {
  TempDir dir{"ember_safetensors"};
  const std::string p = dir.file("model.safetensors");
  save_safetensors(p, {{"x", ones({3})}});
  save_safetensors(p, {{"y", zeros({2}, {DType::i64})}});
  auto out = load_safetensors(p);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out.at("y").to_vector<int64_t>(), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(dir.names(), std::vector<std::string>{"model.safetensors"});
}

TEST(SafetensorsAtomicWrite, MissingDirectoryNamesThePath) {
  TempDir dir{"ember_safetensors"};
  const std::string p = dir.file("no/such/dir/model.safetensors");
  EXPECT_EMBER_ERROR(save_safetensors(p, {{"x", ones({1})}}), "save_safetensors", p, "cannot create a temporary file",
                     "No such file or directory");
}

TEST(SafetensorsAtomicWrite, WriteAllReportsDiskFull) {
  const int fd = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  if (fd < 0) GTEST_SKIP() << "/dev/full is not available";
  const std::string payload(4096, 'x');
  EXPECT_EMBER_ERROR(write_all(fd, payload.data(), payload.size(), "weights.safetensors"),
                     "error writing 'weights.safetensors'", "No space left on device");
  ::close(fd);
}

// Ignores SIGXFSZ and caps this process's file size, so writes past the cap fail with EFBIG
// the way a full disk fails them, without needing a small filesystem.
class FileSizeCap {
 public:
  explicit FileSizeCap(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &old_);
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit capped = old_;
    capped.rlim_cur = bytes;
    ok_ = ::setrlimit(RLIMIT_FSIZE, &capped) == 0;
  }
  ~FileSizeCap() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  void (*old_handler_)(int) = nullptr;
  bool ok_ = false;
};

TEST(SafetensorsAtomicWrite, FailedWriteRaisesAndKeepsTheOldFile) {
  TempDir dir{"ember_safetensors"};
  const std::string p = dir.file("model.safetensors");
  save_safetensors(p, {{"old", full({4}, 7.0)}});
  const std::string before = read_bytes(p);
  Tensor big = zeros({256, 1024});  // 1 MiB, far past the cap
  {
    FileSizeCap cap(64 * 1024);
    ASSERT_TRUE(cap.ok());
    EXPECT_EMBER_ERROR(save_safetensors(p, {{"big", big}}), "save_safetensors", "error writing '" + p + "'",
                       "File too large");
  }
  EXPECT_EQ(read_bytes(p), before);
  EXPECT_EQ(dir.names(), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(load_safetensors(p).at("old").to_vector<float>(), std::vector<float>(4, 7.0f));
}

TEST(SafetensorsAtomicWrite, AtomicFileDiscardsUncommittedWork) {
  TempDir dir{"ember_safetensors"};
  const std::string p = dir.file("state.bin");
  write_file_atomically(p, "first");
  {
    AtomicFile f(p);
    f.write("second, never committed");
    EXPECT_EQ(fs::path(f.temp_path()).parent_path(), fs::path(dir.path()));
    EXPECT_TRUE(fs::exists(f.temp_path()));
  }
  EXPECT_EQ(read_bytes(p), "first");
  EXPECT_EQ(dir.names(), std::vector<std::string>{"state.bin"});
  AtomicFile g(p);
  g.write("third");
  g.commit();
  EXPECT_EQ(read_bytes(p), "third");
  EXPECT_EMBER_ERROR(g.write("more"), p, "already closed");
  EXPECT_EMBER_ERROR(g.commit(), p, "already closed");
}

// ---------------------------------------------------------------- malformed files, one per problem

class SafetensorsBadInput : public ::testing::Test {
 protected:
  std::string put(const std::string& bytes) {
    const std::string p = dir_.file("bad.safetensors");
    write_bytes(p, bytes);
    return p;
  }
  TempDir dir_{"ember_safetensors"};
};

// Both entry points refuse, with a message naming the file and the problem.
#define EXPECT_REFUSED(bytes, ...)                                                     \
  do {                                                                                 \
    const std::string path_ = put(bytes);                                              \
    EXPECT_EMBER_ERROR(load_safetensors(path_), "load_safetensors: " + path_ + ": ", __VA_ARGS__); \
    EXPECT_EMBER_ERROR(read_safetensors_header(path_), path_, __VA_ARGS__);            \
  } while (0)

namespace {
std::string f32_entry(const std::string& name, const std::string& shape, const std::string& offsets) {
  std::string s = "\"";
  s.append(name).append("\":{\"dtype\":\"F32\",\"shape\":").append(shape);
  s.append(",\"data_offsets\":").append(offsets).append("}");
  return s;
}

// {"e1",e2,...}: a header object from its entries.
std::string object_of(std::initializer_list<std::string> entries) {
  std::string s = "{";
  for (const auto& e : entries) {
    if (s.size() > 1) s += ',';
    s += e;
  }
  return s + "}";
}
}  // namespace

TEST_F(SafetensorsBadInput, MissingFile) {
  const std::string p = dir_.file("absent.safetensors");
  EXPECT_EMBER_ERROR(load_safetensors(p), p, "cannot open", "No such file or directory");
}

TEST_F(SafetensorsBadInput, Directory) {
  EXPECT_EMBER_ERROR(load_safetensors(dir_.path()), dir_.path(), "not a regular file");
}

TEST_F(SafetensorsBadInput, EmptyFile) { EXPECT_REFUSED("", "file is 0 bytes, too short for the 8-byte header length"); }

TEST_F(SafetensorsBadInput, FileShorterThanEightBytes) {
  EXPECT_REFUSED(std::string("\x02\0\0\0\0", 5), "file is 5 bytes, too short");
}

TEST_F(SafetensorsBadInput, HeaderLengthPastEndOfFile) {
  EXPECT_REFUSED(st_file("{}", "", 100), "header length 100 runs past the end of the file (10 bytes)");
}

TEST_F(SafetensorsBadInput, HeaderLengthAbsurd) {
  EXPECT_REFUSED(st_file("{}", "", uint64_t(1) << 40), "header length 1099511627776 is larger than the 100000000-byte limit");
  EXPECT_REFUSED(st_file("{}", "", ~uint64_t(0)), "header length 18446744073709551615 is larger than the");
}

TEST_F(SafetensorsBadInput, HeaderNotUtf8) {
  EXPECT_REFUSED(st_file("{\"a\xff\":1}"), "header is not valid UTF-8 (byte 3 of the header)");
  EXPECT_REFUSED(st_file("{\"\xed\xa0\x80\":1}"), "not valid UTF-8");  // an encoded surrogate
  EXPECT_REFUSED(st_file("{\"\xc0\xaf\":1}"), "not valid UTF-8");      // an overlong '/'
}

TEST_F(SafetensorsBadInput, HeaderNotJson) {
  EXPECT_REFUSED(st_file("{"), "header: invalid JSON", "parse error");
  EXPECT_REFUSED(st_file(""), "header: invalid JSON");
}

TEST_F(SafetensorsBadInput, HeaderTrailingGarbage) {
  EXPECT_REFUSED(st_file("{}x"), "header: invalid JSON");
  // NUL is not JSON padding (the reference refuses it too).
  EXPECT_REFUSED(st_file(std::string("{}\0\0", 4)), "header: invalid JSON: NUL byte at offset 2");
}

TEST_F(SafetensorsBadInput, HeaderNotAnObject) {
  EXPECT_REFUSED(st_file("[]      "), "header must be a JSON object, got array");
  EXPECT_REFUSED(st_file("\"text\""), "header must be a JSON object, got string");
}

TEST_F(SafetensorsBadInput, DuplicateKeys) {
  EXPECT_REFUSED(st_file(object_of({f32_entry("a", "[1]", "[0,4]"), f32_entry("a", "[1]", "[0,4]")}),
                         std::string(4, '\0')),
                 "duplicate key 'a'");
}

TEST_F(SafetensorsBadInput, EntryNotAnObject) {
  EXPECT_REFUSED(st_file("{\"a\":[0,4]}"), "tensor 'a': entry must be an object, got array");
}

TEST_F(SafetensorsBadInput, EntryMissingDtype) {
  EXPECT_REFUSED(st_file("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", std::string(4, '\0')),
                 "tensor 'a': missing 'dtype'");
}

TEST_F(SafetensorsBadInput, EntryMissingShape) {
  EXPECT_REFUSED(st_file("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", std::string(4, '\0')),
                 "tensor 'a': missing 'shape'");
}

TEST_F(SafetensorsBadInput, EntryMissingDataOffsets) {
  EXPECT_REFUSED(st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", std::string(4, '\0')),
                 "tensor 'a': missing 'data_offsets'");
}

TEST_F(SafetensorsBadInput, DtypeNotAString) {
  EXPECT_REFUSED(st_file("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", std::string(4, '\0')),
                 "tensor 'a': 'dtype' must be a string, got integer 7");
}

TEST_F(SafetensorsBadInput, UnknownDtype) {
  EXPECT_REFUSED(st_file("{\"a\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,4]}}", std::string(4, '\0')),
                 "tensor 'a': unknown dtype 'Q7'");
  EXPECT_REFUSED(st_file("{\"a\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", std::string(4, '\0')),
                 "unknown dtype 'f32'");  // codes are case-sensitive, as in the reference
}

TEST_F(SafetensorsBadInput, DtypeOfTheFormatThatEmberLacks) {
  EXPECT_REFUSED(st_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", std::string(1, '\0')),
                 "tensor 'a': dtype 'U8' is not supported", "F32, F64, F16, BF16, I32, I64 and BOOL");
}

TEST_F(SafetensorsBadInput, ShapeNotAnArray) {
  EXPECT_REFUSED(st_file(object_of({f32_entry("a", "\"1\"", "[0,4]")}), std::string(4, '\0')),
                 "tensor 'a': 'shape' must be an array of non-negative integers, got string \"1\"");
}

TEST_F(SafetensorsBadInput, ShapeNegative) {
  EXPECT_REFUSED(st_file(object_of({f32_entry("a", "[1,-2]", "[0,4]")}), std::string(4, '\0')),
                 "tensor 'a': shape entry 1 must be a non-negative integer, got integer -2");
}

TEST_F(SafetensorsBadInput, ShapeNotIntegers) {
  EXPECT_REFUSED(st_file(object_of({f32_entry("a", "[1.5]", "[0,4]")}), std::string(4, '\0')),
                 "shape entry 0 must be a non-negative integer, got float 1.5");
  EXPECT_REFUSED(st_file(object_of({f32_entry("a", "[1.0]", "[0,4]")}), std::string(4, '\0')),
                 "shape entry 0 must be a non-negative integer, got float 1.0");
  EXPECT_REFUSED(st_file(object_of({f32_entry("a", "[\"1\"]", "[0,4]")}), std::string(4, '\0')),
                 "got string \"1\"");
  EXPECT_REFUSED(st_file(object_of({f32_entry("a", "[null]", "[0,4]")}), std::string(4, '\0')), "got null");
}

TEST_F(SafetensorsBadInput, ShapeProductOverflows) {
  // The reference's own overflow cases.
  EXPECT_REFUSED(st_file(object_of({f32_entry("a", "[2,18446744073709551614]", "[0,16]")}), std::string(16, '\0')),
                 "tensor 'a': shape [2,18446744073709551614] has more elements than a 64-bit count can hold");
  EXPECT_REFUSED(st_file(object_of({f32_entry("a", "[2,9223372036854775807]", "[0,16]")}), std::string(16, '\0')),
                 "has more elements than a 64-bit count can hold");
  // Fits as an element count, overflows as bytes.
  EXPECT_REFUSED(st_file(object_of({f32_entry("a", "[4611686018427387904]", "[0,16]")}), std::string(16, '\0')),
                 "tensor 'a': shape [4611686018427387904] of F32 needs more bytes than a 64-bit count can hold");
}

TEST_F(SafetensorsBadInput, DataOffsetsNotAPair) {
  const std::string data(4, '\0');
  for (const char* bad : {"[0]", "[0,4,4]", "\"0,4\"", "[0,-4]", "[0,4.0]", "{\"begin\":0}", "[null,4]"}) {
    SCOPED_TRACE(bad);
    EXPECT_REFUSED(st_file(object_of({f32_entry("a", "[1]", bad)}), data),
                   "tensor 'a': 'data_offsets' must be [begin, end] with non-negative integers");
  }
}

TEST_F(SafetensorsBadInput, DataOffsetsBeginAfterEnd) {
  EXPECT_REFUSED(st_file(object_of({f32_entry("a", "[0]", "[8,4]")}), std::string(8, '\0')),
                 "tensor 'a': data_offsets [8, 4] have begin > end");
}

TEST_F(SafetensorsBadInput, ByteLengthDoesNotMatchShape) {
  EXPECT_REFUSED(st_file(object_of({f32_entry("a", "[2,2]", "[0,4]")}), std::string(4, '\0')),
                 "tensor 'a': data_offsets [0, 4] span 4 bytes but shape [2, 2] of F32 needs 16 bytes");
}

TEST_F(SafetensorsBadInput, OffsetsPastEndOfBuffer) {
  EXPECT_REFUSED(st_file(object_of({f32_entry("a", "[4]", "[0,16]")}), std::string(8, '\0')),
                 "tensor 'a': data_offsets [0, 16] run past the end of the data buffer (8 bytes)");
  // An offset beyond anything a file could hold.
  EXPECT_REFUSED(st_file(object_of({f32_entry("a", "[1]", "[18446744073709551610,18446744073709551614]")}),
                         std::string(4, '\0')),
                 "run past the end of the data buffer (4 bytes)");
}

TEST_F(SafetensorsBadInput, OverlappingTensors) {
  EXPECT_REFUSED(st_file(object_of({f32_entry("a", "[2]", "[0,8]"), f32_entry("b", "[2]", "[4,12]")}),
                         std::string(12, '\0')),
                 "tensors 'a' and 'b' overlap: 'b' starts at byte 4 before 'a' ends at byte 8");
  // Two names for the same bytes.
  EXPECT_REFUSED(st_file(object_of({f32_entry("a", "[1]", "[0,4]"), f32_entry("b", "[1]", "[0,4]")}),
                         std::string(4, '\0')),
                 "tensors 'a' and 'b' overlap");
}

TEST_F(SafetensorsBadInput, GapBetweenTensors) {
  EXPECT_REFUSED(st_file(object_of({f32_entry("a", "[1]", "[0,4]"), f32_entry("b", "[1]", "[8,12]")}),
                         std::string(12, '\0')),
                 "bytes [4, 8) of the data buffer belong to no tensor (gap before 'b')");
}

TEST_F(SafetensorsBadInput, GapBeforeFirstTensor) {
  EXPECT_REFUSED(st_file(object_of({f32_entry("a", "[1]", "[4,8]")}), std::string(8, '\0')),
                 "bytes [0, 4) of the data buffer belong to no tensor (gap before 'a')");
}

TEST_F(SafetensorsBadInput, TrailingBytesAfterLastTensor) {
  EXPECT_REFUSED(st_file(object_of({f32_entry("a", "[1]", "[0,4]")}), std::string(8, '\0')),
                 "the data buffer has 4 bytes after the last tensor (bytes [4, 8) belong to no tensor)");
  EXPECT_REFUSED(st_file("{}", "x"), "the data buffer has 1 bytes after the last tensor");
}

TEST_F(SafetensorsBadInput, MetadataNotAnObject) {
  EXPECT_REFUSED(st_file("{\"__metadata__\":[\"a\"]}"), "'__metadata__' must be an object of strings, got array");
  EXPECT_REFUSED(st_file("{\"__metadata__\":\"a\"}"), "'__metadata__' must be an object of strings, got string");
}

TEST_F(SafetensorsBadInput, MetadataValueNotAString) {
  EXPECT_REFUSED(st_file("{\"__metadata__\":{\"ok\":\"v\",\"k\":1}}"),
                 "'__metadata__' field 'k' must be a string, got integer 1");
  EXPECT_REFUSED(st_file("{\"__metadata__\":{\"k\":{\"nested\":\"v\"}}}"), "field 'k' must be a string, got object");
}

TEST_F(SafetensorsBadInput, BoolByteOtherThanZeroOrOne) {
  const std::string p = put(st_file("{\"m\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[0,3]}}",
                                    std::string("\x01\x02\x00", 3)));
  EXPECT_EMBER_ERROR(load_safetensors(p), p, "tensor 'm': BOOL element 1 has byte value 2 (must be 0 or 1)");
}

TEST_F(SafetensorsBadInput, LongNamesAreShortenedInMessages) {
  std::string entry = "\"";
  entry.append(5000, 'w').append("\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,4]}");
  const std::string p = put(st_file(object_of({entry}), std::string(4, '\0')));
  try {
    load_safetensors(p);
    ADD_FAILURE() << "expected ember::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("tensor '" + std::string(97, 'w') + "...': unknown dtype 'Q7'"), std::string::npos) << msg;
    EXPECT_LT(msg.size(), 400u);
  }
}

// Files the reference accepts load here too.
TEST_F(SafetensorsBadInput, AcceptsWhatTheReferenceAccepts) {
  // Whitespace around the JSON, a null __metadata__, unknown fields in an entry.
  {
    const std::string p = put(st_file(" \t\n{\"__metadata__\":null,\"a\":{\"dtype\":\"I32\",\"shape\":[],"
                                      "\"data_offsets\":[0,4],\"extra\":[1]}}\r\n ",
                                      std::string("\x2a\0\0\0", 4)));
    SafetensorsFile f = load_safetensors_with_metadata(p);
    EXPECT_TRUE(f.metadata.empty());
    EXPECT_EQ(f.tensors.at("a").shape(), Shape{});
    EXPECT_EQ(f.tensors.at("a").item<int>(), 42);
  }
  // Data not aligned to its element size (an I8-sized BOOL first), tensors listed out of order,
  // zero-size tensors anywhere.
  {
    float v = 1.5f;
    const std::string p = put(st_file(object_of({f32_entry("f", "[1]", "[1,5]"),
                                                 "\"b\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[0,1]}",
                                                 f32_entry("z", "[0,2]", "[5,5]")}),
                                      std::string("\x01", 1) + std::string(reinterpret_cast<char*>(&v), 4)));
    auto t = load_safetensors(p);
    EXPECT_EQ(t.at("f").item<float>(), 1.5f);
    EXPECT_EQ(t.at("b").item<bool>(), true);
    EXPECT_EQ(t.at("z").shape(), (Shape{0, 2}));
  }
  // A file with no tensors and no padding.
  EXPECT_TRUE(load_safetensors(put(st_file("{}"))).empty());
}
