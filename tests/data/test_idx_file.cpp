// The IDX reader and writer (every type, plain and gzip, each kind of damage named clearly) and
// Fashion-MNIST as Debian's dataset-fashion-mnist package ships it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/idx_file.h"
#include "data/image_datasets.h"
#include "data/text_io.h"
#include "test_util.h"

using namespace ember;
using namespace ember::data;
using ember::testing::TempDir;

namespace {

// An array of `dims` whose i-th value is i * 3 - 7 stored in `type` (host byte order).
IdxArray ramp(IdxType type, std::vector<int64_t> dims) {
  IdxArray a;
  a.type = type;
  a.dims = std::move(dims);
  const int64_t n = a.numel();
  a.bytes.resize(size_t(n) * idx_type_size(type));
  for (int64_t i = 0; i < n; ++i) {
    double v = double(i * 3 - 7);
    uint8_t* dst = a.bytes.data() + i * int64_t(idx_type_size(type));
    switch (type) {
      case IdxType::u8: *dst = uint8_t(i % 256); break;
      case IdxType::i8: *dst = uint8_t(int8_t(v)); break;
      case IdxType::i16: { int16_t x = int16_t(v); std::memcpy(dst, &x, 2); break; }
      case IdxType::i32: { int32_t x = int32_t(v * 1000); std::memcpy(dst, &x, 4); break; }
      case IdxType::f32: { float x = float(v) / 8; std::memcpy(dst, &x, 4); break; }
      case IdxType::f64: { double x = v / 3; std::memcpy(dst, &x, 8); break; }
    }
  }
  return a;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST(IdxFile, EveryTypeRoundTripsPlainAndGzip) {
  TempDir dir("ember_idx");
  for (IdxType type : {IdxType::u8, IdxType::i8, IdxType::i16, IdxType::i32, IdxType::f32, IdxType::f64}) {
    for (bool gzip : {false, true}) {
      IdxArray a = ramp(type, {3, 5, 2});
      std::string path = dir.file(std::string("a_") + std::to_string(int(type)) + (gzip ? ".gz" : ""));
      write_idx(path, a, gzip);
      IdxArray b = read_idx(path);
      EXPECT_EQ(b.type, type);
      EXPECT_EQ(b.dims, a.dims);
      EXPECT_EQ(b.bytes, a.bytes) << idx_type_name(type) << (gzip ? " gzip" : " plain");
    }
  }
}

TEST(IdxFile, StoresValuesBigEndianAsTheFormatSays) {
  TempDir dir("ember_idx");
  IdxArray a;
  a.type = IdxType::i32;
  a.dims = {2};
  int32_t values[2] = {0x01020304, -2};
  a.bytes.resize(8);
  std::memcpy(a.bytes.data(), values, 8);
  write_idx(dir.file("be"), a);
  std::string raw = read_bytes(dir.file("be"));
  ASSERT_EQ(raw.size(), 4u + 4u + 8u);
  EXPECT_EQ(raw.substr(0, 8), std::string("\x00\x00\x0c\x01\x00\x00\x00\x02", 8));
  EXPECT_EQ(raw.substr(8, 4), std::string("\x01\x02\x03\x04", 4));
  EXPECT_EQ(raw.substr(12, 4), std::string("\xff\xff\xff\xfe", 4));
}

TEST(IdxFile, ToTensorKeepsFloatsAndWidensIntegers) {
  IdxArray f = ramp(IdxType::f32, {2, 3});
  Tensor tf = f.to_tensor();
  EXPECT_EQ(tf.dtype(), DType::f32);
  EXPECT_EQ(tf.shape(), (Shape{2, 3}));
  EXPECT_FLOAT_EQ(tf.to_vector<float>()[5], float(5 * 3 - 7) / 8);
  IdxArray s = ramp(IdxType::i8, {4});
  Tensor ts = s.to_tensor();
  EXPECT_EQ(ts.dtype(), DType::i64);
  EXPECT_EQ(ts.to_vector<int64_t>(), (std::vector<int64_t>{-7, -4, -1, 2}));
  IdxArray u = ramp(IdxType::u8, {300});
  EXPECT_EQ(u.to_tensor().to_vector<int64_t>()[299], 299 % 256);
}

TEST(IdxFile, DamagedFilesAreErrorsNamingTheFile) {
  TempDir dir("ember_idx");
  IdxArray a = ramp(IdxType::u8, {4, 3});
  write_idx(dir.file("good"), a);
  std::string good = read_bytes(dir.file("good"));

  std::string truncated = dir.write("truncated", good.substr(0, good.size() - 5));
  EXPECT_EMBER_ERROR(read_idx(truncated), "truncated", "truncated", "need 12 data bytes, the file has 7");
  std::string longer = dir.write("longer", good + "xy");
  EXPECT_EMBER_ERROR(read_idx(longer), "longer", "bytes after the 12 data bytes");
  std::string magic = good;
  magic[0] = 1;
  EXPECT_EMBER_ERROR(read_idx(dir.write("magic", magic)), "magic", "not an IDX file");
  std::string type = good;
  type[2] = 0x07;
  EXPECT_EMBER_ERROR(read_idx(dir.write("type", type)), "type", "unknown IDX type code");
  std::string nodims = good;
  nodims[3] = 0;
  EXPECT_EMBER_ERROR(read_idx(dir.write("nodims", nodims)), "nodims", "0 dimensions");
  EXPECT_EMBER_ERROR(read_idx(dir.write("short_header", good.substr(0, 6))), "short_header",
                     "ends inside its header");
  EXPECT_EMBER_ERROR(read_idx(dir.write("tiny", good.substr(0, 2))), "tiny", "too short");
  std::string huge = good;
  huge[4] = '\x7f';  // the first dimension becomes about two billion
  EXPECT_EMBER_ERROR(read_idx(dir.write("huge", huge), 1 << 20), "huge", "would exceed");
  EXPECT_EMBER_ERROR(read_idx(dir.file("missing")), "missing", "cannot open");
}

TEST(IdxFile, CorruptOrCutGzipIsAnError) {
  TempDir dir("ember_idx");
  write_idx(dir.file("a.gz"), ramp(IdxType::f32, {64, 64}), /*gzip=*/true);
  std::string gz = read_bytes(dir.file("a.gz"));
  ASSERT_GT(gz.size(), 64u);
  std::string cut = dir.write("cut.gz", gz.substr(0, gz.size() / 2));
  EXPECT_EMBER_ERROR(read_idx(cut), "cut.gz");
  std::string flipped = gz;
  for (size_t i = 20; i < 40; ++i) flipped[i] = char(~flipped[i]);
  EXPECT_EMBER_ERROR(read_idx(dir.write("flipped.gz", flipped)), "flipped.gz");
}

TEST(IdxFile, WriteRejectsInconsistentArrays) {
  TempDir dir("ember_idx");
  IdxArray a = ramp(IdxType::i16, {3});
  a.bytes.pop_back();
  EXPECT_EMBER_ERROR(write_idx(dir.file("x"), a), "write_idx", "5 bytes do not hold [3]");
  IdxArray none;
  EXPECT_EMBER_ERROR(write_idx(dir.file("y"), none), "write_idx", "0 dimensions");
}

TEST(IdxImageDataset, ExamplesAreScaledImagesAndLabels) {
  TempDir dir("ember_idx");
  IdxArray images = ramp(IdxType::u8, {3, 2, 2});
  IdxArray labels;
  labels.type = IdxType::u8;
  labels.dims = {3};
  labels.bytes = {2, 0, 1};
  write_idx(dir.file("img"), images, true);
  write_idx(dir.file("lab"), labels);
  IdxImageOptions options;
  options.num_classes = 3;
  options.mean = 0.5;
  options.std = 0.25;
  IdxImageDataset ds(dir.file("img"), dir.file("lab"), options);
  ASSERT_EQ(ds.size(), 3);
  Example e = ds.get(2);
  EXPECT_EQ(e.at("pixel_values").shape(), (Shape{1, 2, 2}));
  std::vector<float> px = e.at("pixel_values").to_vector<float>();
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(px[size_t(i)], ((8 + i) / 255.0 - 0.5) / 0.25, 1e-6);
  EXPECT_EQ(e.at("labels").item<int64_t>(), 1);
  EXPECT_EMBER_ERROR(ds.get(3), "index 3 out of range");

  options.num_classes = 2;
  EXPECT_EMBER_ERROR(IdxImageDataset(dir.file("img"), dir.file("lab"), options), "lab", "label 0 is 2");
  labels.dims = {2};
  labels.bytes = {0, 1};
  write_idx(dir.file("lab2"), labels);
  EXPECT_EMBER_ERROR(IdxImageDataset(dir.file("img"), dir.file("lab2")), "3 images", "2 labels");
  EXPECT_EMBER_ERROR(IdxImageDataset(dir.file("lab"), dir.file("lab")), "[N, H, W]");
}

// Debian's dataset-fashion-mnist (installed by scripts/install_deps.sh): the counts, shapes and
// class balance the dataset's authors publish, and the normalisation constants Ember uses.
TEST(FashionMnist, DebianFilesHoldTheBalancedSplits) {
  for (auto [split, n] : {std::pair<std::string, int64_t>{"train", 60000}, {"test", 10000}}) {
    IdxImageDataset ds = fashion_mnist(split);
    ASSERT_EQ(ds.size(), n) << split;
    EXPECT_EQ(ds.height(), 28);
    EXPECT_EQ(ds.width(), 28);
    std::vector<int64_t> per_class(10, 0);
    for (int64_t label : ds.labels()) per_class[size_t(label)]++;
    for (int c = 0; c < 10; ++c) EXPECT_EQ(per_class[size_t(c)], n / 10) << split << " class " << c;
  }
  IdxArray train = read_idx(fashion_mnist_dir() + "/train-images-idx3-ubyte.gz");
  double sum = 0, sum_sq = 0;
  for (uint8_t b : train.bytes) {
    double x = b / 255.0;
    sum += x;
    sum_sq += x * x;
  }
  double count = double(train.bytes.size());
  double mean = sum / count;
  EXPECT_NEAR(mean, kFashionMnistMean, 5e-5);
  EXPECT_NEAR(std::sqrt(sum_sq / count - mean * mean), kFashionMnistStd, 5e-5);
  EXPECT_EMBER_ERROR(fashion_mnist("validation"), "\"train\" or \"test\"");
  EXPECT_EMBER_ERROR(fashion_mnist("train", "/nonexistent"), "dataset-fashion-mnist", "install_deps");
}
