// Shared test helpers: random shapes and tensors (contiguous or not), comparisons against the
// reference with dtype-fit tolerances, gradient checks, thread-count runs, temporary
// directories and error assertions.
#pragma once
#include <gtest/gtest.h>

#include <array>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ember/ember.h"
#include "kernels/reference/ref_tensor.h"

namespace ember::testing {

// Fresh seed per test run unless EMBER_TEST_SEED is set; printed on failure via SCOPED_TRACE.
uint64_t test_seed();
std::mt19937_64& rng();

// Uniform integer in [lo, hi] and a fair coin, both drawn from rng().
int64_t uniform_int(int64_t lo, int64_t hi);
bool coin();

// The floating-point element types, which every float op is tested in.
inline constexpr std::array<DType, 4> kFloatTypes = {DType::f32, DType::f64, DType::f16, DType::bf16};

// Relative tolerance for comparing results of `dtype` against the double reference.
double tolerance(DType dtype);

// Random tensor; values in [lo, hi). non_contiguous=true returns a strided view of a larger
// buffer (transposed and/or sliced) with the requested logical shape.
Tensor random_tensor(const Shape& shape, DType dtype = DType::f32, bool non_contiguous = false,
                     double lo = -2.0, double hi = 2.0);
// A random shape with `ndim` dims, each in [0 or 1, max_size].
Shape random_shape(int ndim, int64_t max_size = 6, bool allow_zero = false);
// Shapes that broadcast together: b keeps or drops leading dims of a and sets some to 1.
std::pair<Shape, Shape> random_broadcast_pair(int ndim, int64_t max_size = 5);
// Random indices in [0, high) of `shape` (0 when high <= 0); non_contiguous=true returns a
// strided view of a buffer twice as long in the last dim.
Tensor random_index(const Shape& shape, int64_t high, DType dtype = DType::i64, bool non_contiguous = false);

// Expects ember::gradcheck of fn at inputs to pass, reporting its message otherwise.
void expect_gradcheck(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
                      const std::vector<Tensor>& inputs);

// Runs fn with one thread and with two and returns both results (for determinism checks).
std::pair<Tensor, Tensor> with_one_and_two_threads(const std::function<Tensor()>& fn);

// A fresh directory under the system temp directory, named `<prefix>_XXXXXX`, removed with
// everything in it on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // Writes `bytes` as the file `name` in the directory and returns its path.
  std::string write(const std::string& name, const std::string& bytes) const;
  // The names of the entries in the directory, sorted.
  std::vector<std::string> names() const;

 private:
  std::string path_;
};

// |actual - expected| <= atol + rtol * |expected| elementwise; NaNs must match.
::testing::AssertionResult all_close(const Tensor& actual, const reference::RefTensor& expected,
                                     double rtol, double atol);
::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double rtol, double atol);

}  // namespace ember::testing

// Asserts that `stmt` throws ember::Error whose message contains every given fragment.
#define EXPECT_EMBER_ERROR(stmt, ...)                                                   \
  do {                                                                                  \
    try {                                                                               \
      stmt;                                                                             \
      ADD_FAILURE() << "expected ember::Error from: " #stmt;                            \
    } catch (const ::ember::Error& e) {                                                 \
      for (const std::string& frag : std::vector<std::string>{__VA_ARGS__})             \
        EXPECT_NE(std::string(e.what()).find(frag), std::string::npos)                  \
            << "message \"" << e.what() << "\" lacks \"" << frag << "\"";               \
    }                                                                                   \
  } while (0)
