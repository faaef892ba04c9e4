#include "test_util.h"

#include <cmath>
#include <cstdlib>

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
