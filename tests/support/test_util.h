// Shared test helpers: random shapes and tensors (contiguous or not), comparisons against the
// reference with dtype-fit tolerances, and error assertions.
#pragma once
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "ember/ember.h"
#include "kernels/reference/ref_tensor.h"

namespace ember::testing {

// Fresh seed per test run unless EMBER_TEST_SEED is set; printed on failure via SCOPED_TRACE.
uint64_t test_seed();
std::mt19937_64& rng();

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
