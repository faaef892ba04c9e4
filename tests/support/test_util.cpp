#include "test_util.h"

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace ember::testing {

uint64_t test_seed() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("EMBER_TEST_SEED")) return uint64_t(std::strtoull(s, nullptr, 10));
    return uint64_t(std::random_device{}());
  }();
  return seed;
}

std::mt19937_64& rng() {
  static std::mt19937_64 gen = [] {
    std::printf("[ember] test seed %llu (set EMBER_TEST_SEED to replay)\n",
                static_cast<unsigned long long>(test_seed()));
    manual_seed(test_seed());
    return std::mt19937_64(test_seed());
  }();
  return gen;
}

int64_t uniform_int(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng()); }

bool coin() { return uniform_int(0, 1) == 1; }

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64: return 1e-10;
    case DType::f32: return 1e-5;
    case DType::f16: return 2e-3;
    case DType::bf16: return 1.6e-2;
    default: return 0.0;
  }
}

Tensor random_tensor(const Shape& shape, DType dtype, bool non_contiguous, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  auto fill = [&](const Shape& s) {
    std::vector<double> v(size_t(numel_of(s)));
    for (auto& x : v) x = dist(rng());
    Tensor t = from_vector(v, {int64_t(v.size())});
    return t.reshape(s).to(dtype);  // reshape({}) gives the 0-d case
  };
  if (!non_contiguous || shape.empty()) return fill(shape);
  // Build a bigger buffer with the last two dims swapped and every dim padded, then view it.
  Shape big = shape;
  for (auto& s : big) s = s * 2 + 1;
  if (big.size() >= 2) std::swap(big[big.size() - 1], big[big.size() - 2]);
  Tensor base = fill(big);
  Tensor v = base;
  if (shape.size() >= 2) v = v.transpose(-1, -2);
  for (size_t d = 0; d < shape.size(); ++d) v = v.slice(int64_t(d), 1, 1 + 2 * shape[d], 2);
  return v.detach();
}

Shape random_shape(int ndim, int64_t max_size, bool allow_zero) {
  std::uniform_int_distribution<int64_t> dist(allow_zero ? 0 : 1, max_size);
  Shape s(static_cast<size_t>(ndim), 0);
  for (auto& x : s) x = dist(rng());
  return s;
}

std::pair<Shape, Shape> random_broadcast_pair(int ndim, int64_t max_size) {
  Shape a = random_shape(ndim, max_size);
  Shape b = a;
  std::uniform_int_distribution<int> coin(0, 2);
  for (auto& x : b)
    if (coin(rng()) == 0) x = 1;
  const int drop = std::uniform_int_distribution<int>(0, ndim)(rng());
  b.erase(b.begin(), b.begin() + drop);
  if (coin(rng()) == 0) std::swap(a, b);
  return {a, b};
}

Tensor random_index(const Shape& shape, int64_t high, DType dtype, bool non_contiguous) {
  Shape big = shape;
  if (non_contiguous && !big.empty()) big.back() *= 2;
  std::vector<int64_t> v(size_t(numel_of(big)));
  for (auto& x : v) x = high > 0 ? uniform_int(0, high - 1) : 0;
  Tensor t = from_vector(v, {int64_t(v.size())}).reshape(big).to(dtype);
  if (non_contiguous && !shape.empty()) t = t.slice(-1, 0, big.back(), 2);
  return t;
}

void expect_gradcheck(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
                      const std::vector<Tensor>& inputs) {
  const GradcheckResult r = gradcheck(fn, inputs);
  EXPECT_TRUE(r.ok) << r.message;
}

std::pair<Tensor, Tensor> with_one_and_two_threads(const std::function<Tensor()>& fn) {
  const int saved = get_num_threads();
  set_num_threads(1);
  Tensor a = fn();
  set_num_threads(2);
  Tensor b = fn();
  set_num_threads(saved);
  return {a, b};
}

TempDir::TempDir(const std::string& prefix) {
  std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::write(const std::string& name, const std::string& bytes) const {
  const std::string path = file(name);
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  return path;
}

std::vector<std::string> TempDir::names() const {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(path_)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

::testing::AssertionResult all_close(const Tensor& actual, const reference::RefTensor& expected,
                                     double rtol, double atol) {
  if (actual.shape() != expected.shape) {
    return ::testing::AssertionFailure() << "shape " << shape_str(actual.shape()) << " != expected " << shape_str(expected.shape);
  }
  const std::vector<double> a = actual.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = expected.data[i];
    if (std::isnan(e) || std::isnan(a[i])) {
      if (std::isnan(e) && std::isnan(a[i])) continue;
      return ::testing::AssertionFailure() << "at flat index " << i << ": got " << a[i] << ", expected " << e;
    }
    if (std::isinf(e) && a[i] == e) continue;
    if (std::abs(a[i] - e) > atol + rtol * std::abs(e)) {
      return ::testing::AssertionFailure() << "at flat index " << i << " (of shape " << shape_str(actual.shape())
                                           << "): got " << a[i] << ", expected " << e << " (rtol " << rtol
                                           << ", atol " << atol << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  return all_close(actual, reference::from_tensor(expected), rtol, atol);
}

}  // namespace ember::testing
