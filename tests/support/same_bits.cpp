#include "same_bits.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"

namespace ember::testing {

::testing::AssertionResult same_bits(const Tensor& actual, const Tensor& expected) {
  if (actual.shape() != expected.shape())
    return ::testing::AssertionFailure() << "shape " << shape_str(actual.shape()) << " vs "
                                         << shape_str(expected.shape());
  const auto a = actual.to(DType::f64).to_vector<double>(), e = expected.to(DType::f64).to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(e[i])) continue;
    if (std::memcmp(&a[i], &e[i], sizeof(double)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << e[i];
  }
  return ::testing::AssertionSuccess();
}

void for_each_odd_row_count_case(const std::function<void(const Tensor& x)>& fn) {
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int64_t len : {1, 7, 16, 37, 128, 600}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " rows of " + std::to_string(len));
      Tensor x = random_tensor({9, len}, dt, false, -30.0, 30.0);
      x.select(0, 3).select(0, len / 2).fill_(std::numeric_limits<double>::quiet_NaN());
      fn(x);
    }
  }
}

}  // namespace ember::testing
