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

::testing::AssertionResult same_bytes(const Tensor& actual, const Tensor& expected) {
  const Tensor a = actual.to(Device::cpu()).contiguous(), e = expected.to(Device::cpu()).contiguous();
  if (a.dtype() != e.dtype() || a.shape() != e.shape())
    return ::testing::AssertionFailure() << dtype_name(a.dtype()) << " " << shape_str(a.shape()) << " vs "
                                         << dtype_name(e.dtype()) << " " << shape_str(e.shape());
  const size_t size = a.element_size();
  const auto* pa = static_cast<const unsigned char*>(a.raw_data());
  const auto* pe = static_cast<const unsigned char*>(e.raw_data());
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::memcmp(pa + size_t(i) * size, pe + size_t(i) * size, size) == 0) continue;
    const auto av = a.to(DType::f64).to_vector<double>(), ev = e.to(DType::f64).to_vector<double>();
    return ::testing::AssertionFailure() << "element " << i << " differs: " << av[size_t(i)] << " vs "
                                         << ev[size_t(i)];
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

void expect_rows_alone_as_among_others(const Tensor& x, const RowNormForward& forward) {
  const int64_t rows = x.shape()[0], len = x.shape()[1];
  std::vector<float> gv(size_t(rows * len));
  for (float& v : gv) v = std::ldexp(coin() ? 1.0f : -1.0f, int(uniform_int(-12, 12)));
  const Tensor g = from_vector(gv, {rows, len}).to(x.dtype());
  Tensor w = random_tensor({len}).requires_grad_(), b = random_tensor({len}).requires_grad_();
  Tensor xa = x.detach().requires_grad_();
  const Tensor y = forward(xa, 0, w, b);
  y.backward(g);
  const Tensor dw = w.grad(), db = b.grad();
  w.set_grad(Tensor());
  b.set_grad(Tensor());
  for (int64_t r = 0; r < rows; ++r) {
    Tensor xr = x.narrow(0, r, 1).contiguous().requires_grad_();
    const Tensor yr = forward(xr, r, w, b);
    yr.backward(g.narrow(0, r, 1).contiguous());
    EXPECT_TRUE(same_bits(y.detach().narrow(0, r, 1), yr.detach())) << "y of row " << r;
    EXPECT_TRUE(same_bits(xa.grad().narrow(0, r, 1), xr.grad())) << "dx of row " << r;
  }
  EXPECT_TRUE(same_bits(dw, w.grad())) << "dweight";
  EXPECT_TRUE(same_bits(db, b.grad())) << "dbias";
}

}  // namespace ember::testing
