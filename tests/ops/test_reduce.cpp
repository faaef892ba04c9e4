// Reductions (sum, mean, amax, amin, argmax, argmin, var): forward against the double
// reference over random shapes, dim sets, layouts and dtypes, including size-0 and size-1
// dims and every kernel path (rows, columns, permuted, split long reductions); backward
// through gradcheck; errors that name the op and the shape.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "kernels/reference/reduce.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::coin;
using ember::testing::kFloatTypes;
using ember::testing::random_shape;
using ember::testing::random_tensor;
using ember::testing::tolerance;
using ember::testing::uniform_int;
using reference::RefTensor;

namespace {

// A random subset of the dims of an ndim tensor, each written positive or negative at random;
// may be empty (meaning all dims).
Shape random_dims(int64_t ndim) {
  Shape dims;
  for (int64_t d = 0; d < ndim; ++d)
    if (uniform_int(0, 2) == 0) dims.push_back(coin() ? d : d - ndim);
  if (dims.size() > 1 && coin()) std::swap(dims.front(), dims.back());  // order must not matter
  return dims;
}

bool reduces_empty_dim(const Shape& shape, const Shape& dims) {
  if (shape.empty()) return false;
  if (dims.empty()) return numel_of(shape) == 0;
  for (int64_t d : dims)
    if (shape[size_t(d < 0 ? d + int64_t(shape.size()) : d)] == 0) return true;
  return false;
}

int64_t reduced_count(const Shape& shape, const Shape& dims) {
  if (dims.empty()) return numel_of(shape);
  int64_t n = 1;
  for (int64_t d : dims) n *= shape[size_t(d < 0 ? d + int64_t(shape.size()) : d)];
  return n;
}

std::string describe(const Shape& shape, const Shape& dims, bool keepdim, bool non_contiguous, DType dt) {
  return "shape " + shape_str(shape) + " dims " + shape_str(dims) + (keepdim ? " keepdim" : "") +
         (non_contiguous ? " non-contiguous " : " contiguous ") + dtype_name(dt);
}

// Checks every dims-taking reduction on x against the reference.
void check_all_reductions(const Tensor& x, const Shape& dims, bool keepdim) {
  const DType dt = x.dtype();
  const double tol = tolerance(dt);
  const RefTensor rx = reference::from_tensor(x);
  EXPECT_TRUE(all_close(sum(x, dims, keepdim), reference::sum(rx, dims, keepdim), tol, tol)) << "sum";
  EXPECT_TRUE(all_close(mean(x, dims, keepdim), reference::mean(rx, dims, keepdim), tol, tol)) << "mean";
  const int64_t correction = uniform_int(0, 2);
  EXPECT_TRUE(all_close(var(x, dims, correction, keepdim), reference::var(rx, dims, correction, keepdim), tol, tol))
      << "var correction " << correction;
  if (reduces_empty_dim(x.shape(), dims)) return;
  // amax / amin are exact: the result is one of the inputs
  EXPECT_TRUE(all_close(amax(x, dims, keepdim), reference::amax(rx, dims, keepdim), 0, 0)) << "amax";
  EXPECT_TRUE(all_close(amin(x, dims, keepdim), reference::amin(rx, dims, keepdim), 0, 0)) << "amin";
}

}  // namespace

TEST(Reduce, RandomShapesDimsLayoutsAndDtypesMatchReference) {
  for (DType dt : kFloatTypes) {
    for (int trial = 0; trial < 60; ++trial) {
      const int ndim = uniform_int(0, 4);
      const Shape shape = random_shape(ndim, 5, /*allow_zero=*/trial % 5 == 0);
      const bool non_contiguous = coin();
      const Shape dims = random_dims(ndim);
      const bool keepdim = coin();
      SCOPED_TRACE(describe(shape, dims, keepdim, non_contiguous, dt));
      check_all_reductions(random_tensor(shape, dt, non_contiguous), dims, keepdim);
    }
  }
}

TEST(Reduce, EveryKernelPathMatchesReference) {
  // contiguous inputs whose reduced dims are trailing (rows), leading (columns), in the middle
  // ([outer, reduced, inner]), interleaved (permuted copy), or separated only by size-1 dims
  struct Case {
    Shape shape;
    Shape dims;
  };
  const std::vector<Case> cases = {
      {{7, 33}, {1}},          {{7, 33}, {0}},          {{300, 130}, {0}},     {{4, 5, 6}, {1}},
      {{4, 5, 6}, {0, 2}},     {{3, 4, 5, 6}, {1, 2}},  {{3, 4, 5, 6}, {0, 1}}, {{3, 4, 5, 6}, {1, 3}},
      {{2, 1, 5, 1, 3}, {0, 2}}, {{5, 1, 7}, {1}},      {{1, 9}, {0}},         {{9, 1}, {1}},
      {{2, 3}, {}},            {{1}, {0}},              {{6, 200}, {-1, -2}},  {{3, 2, 1300}, {0, 1}},
  };
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    for (const Case& c : cases) {
      for (bool keepdim : {false, true}) {
        for (bool non_contiguous : {false, true}) {
          SCOPED_TRACE(describe(c.shape, c.dims, keepdim, non_contiguous, dt));
          check_all_reductions(random_tensor(c.shape, dt, non_contiguous), c.dims, keepdim);
        }
      }
    }
  }
}

TEST(Reduce, LongReductionsSplitIntoChunksMatchReference) {
  // one long row, few long rows, one long column pair, many rows of a few columns
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{200000}, {}}, {{3, 70000}, {1}}, {{70000, 3}, {0}}, {{4, 3000, 5}, {1}}, {{5000, 200}, {0}},
  };
  for (const auto& [shape, dims] : cases) {
    SCOPED_TRACE(shape_str(shape) + " dims " + shape_str(dims));
    Tensor x = random_tensor(shape, DType::f32, false, -1.0, 2.0);
    const RefTensor rx = reference::from_tensor(x);
    EXPECT_TRUE(all_close(sum(x, dims), reference::sum(rx, dims, false), 1e-5, 0));
    EXPECT_TRUE(all_close(mean(x, dims), reference::mean(rx, dims, false), 1e-5, 0));
    EXPECT_TRUE(all_close(var(x, dims), reference::var(rx, dims, 1, false), 1e-5, 0));
    EXPECT_TRUE(all_close(amax(x, dims), reference::amax(rx, dims, false), 0, 0));
    EXPECT_TRUE(all_close(amin(x, dims), reference::amin(rx, dims, false), 0, 0));
    if (dims.size() == 1) {
      EXPECT_TRUE(all_close(argmax(x, dims[0]), reference::argmax(rx, dims[0], false), 0, 0));
      EXPECT_TRUE(all_close(argmin(x, dims[0]), reference::argmin(rx, dims[0], false), 0, 0));
    }
  }
}

TEST(Reduce, MillionElementSumIsAccurateAndThreadCountIndependent) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    // f16 tops out at 65504: keep its sum in range
    Tensor x = random_tensor({1000000}, dt, false, 0.0, dt == DType::f16 ? 0.1 : 1.0);
    const RefTensor rx = reference::from_tensor(x);
    Tensor s = sum(x);
    // the result's only error is its final rounding to dt
    EXPECT_TRUE(all_close(s.to(DType::f64), reference::sum(rx, {}, false), std::max(1e-5, tolerance(dt)), 0));
    if (dt == DType::f32) {
      EXPECT_TRUE(all_close(s, reference::sum(rx, {}, false), 1e-7, 0)) << "double accumulation";
      const int saved = get_num_threads();
      set_num_threads(1);
      const float serial = sum(x).item<float>();
      const float serial_cols = sum(x.view({1000, 1000}), {0}).sum().item<float>();
      set_num_threads(saved);
      EXPECT_EQ(serial, s.item<float>());
      EXPECT_EQ(serial_cols, sum(x.view({1000, 1000}), {0}).sum().item<float>());
    }
  }
}

TEST(Reduce, IntegerAndBoolSumsGiveInt64) {
  Tensor i = from_vector<int32_t>({1, -2, 3, 4, 5, 6}, {2, 3});
  Tensor s = sum(i, {1});
  EXPECT_EQ(s.dtype(), DType::i64);
  EXPECT_EQ(s.to_vector<int64_t>(), (std::vector<int64_t>{2, 15}));
  EXPECT_EQ(sum(i, {0}).to_vector<int64_t>(), (std::vector<int64_t>{5, 3, 9}));
  Tensor big = full({3}, double(int64_t(1) << 40), {DType::i64});
  EXPECT_EQ(sum(big).item<int64_t>(), 3 * (int64_t(1) << 40));
  Tensor b = from_vector<bool>({true, false, true, true}, {2, 2});
  EXPECT_EQ(sum(b).dtype(), DType::i64);
  EXPECT_EQ(sum(b).item<int64_t>(), 3);
  EXPECT_EQ(sum(b, {0}).to_vector<int64_t>(), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(amax(i).item<int64_t>(), 6);
  EXPECT_EQ(amin(i, {1}).dtype(), DType::i32);
  EXPECT_EQ(amin(i, {1}).to_vector<int32_t>(), (std::vector<int32_t>{-2, 4}));
  EXPECT_EQ(argmax(i, 1).to_vector<int64_t>(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(argmin(i, 0).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(argmin(i, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
  // a random integer tensor through the reference
  for (int trial = 0; trial < 10; ++trial) {
    const Shape shape = random_shape(3, 5);
    Tensor x = randint(-50, 50, shape, {DType::i32});
    const Shape dims = random_dims(3);
    const RefTensor rx = reference::from_tensor(x);
    EXPECT_TRUE(all_close(sum(x, dims), reference::sum(rx, dims, false), 0, 0));
    EXPECT_TRUE(all_close(amax(x, dims), reference::amax(rx, dims, false), 0, 0));
  }
}

TEST(Reduce, ArgmaxArgminMatchReferenceOnEveryDimWithTies) {
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i64}) {
    for (int trial = 0; trial < 25; ++trial) {
      const int ndim = uniform_int(0, 4);
      const Shape shape = random_shape(ndim, 5);
      // few distinct values, so ties are common: the first index must win
      Tensor x = randint(-2, 3, shape, {DType::i64}).to(dt);
      if (coin() && ndim >= 2) x = x.transpose(0, ndim - 1).contiguous().transpose(0, ndim - 1);
      const int64_t dim = ndim == 0 ? 0 : uniform_int(-ndim, ndim - 1);
      const bool keepdim = coin();
      SCOPED_TRACE(describe(shape, {dim}, keepdim, !x.is_contiguous(), dt));
      const RefTensor rx = reference::from_tensor(x);
      Tensor am = argmax(x, dim, keepdim);
      EXPECT_EQ(am.dtype(), DType::i64);
      EXPECT_TRUE(all_close(am, reference::argmax(rx, dim, keepdim), 0, 0));
      EXPECT_TRUE(all_close(argmin(x, dim, keepdim), reference::argmin(rx, dim, keepdim), 0, 0));
    }
  }
  Tensor t = from_vector<float>({1, 5, 5, 2, 5, 0}, {2, 3});
  EXPECT_EQ(t.argmax(1).to_vector<int64_t>(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(t.argmax(0, true).shape(), (Shape{1, 3}));
  EXPECT_EQ(t.argmax(0, true).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0}));
}

TEST(Reduce, NaNPropagatesThroughMaxMinAndArgmax) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = from_vector<float>({1, nan, 3, 4, 2, 1, nan, 9, 0}, {3, 3});
  EXPECT_TRUE(std::isnan(amax(x).item<float>()));
  EXPECT_TRUE(std::isnan(amin(x).item<float>()));
  auto rows = amax(x, {1}).to_vector<float>();
  EXPECT_TRUE(std::isnan(rows[0]) && rows[1] == 4.0f && std::isnan(rows[2]));
  auto cols = amin(x, {0}).to_vector<float>();  // column path
  EXPECT_TRUE(std::isnan(cols[0]) && std::isnan(cols[1]) && cols[2] == 0.0f);
  EXPECT_EQ(argmax(x, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(argmin(x, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 0}));
  EXPECT_EQ(argmax(x, 0).to_vector<int64_t>(), (std::vector<int64_t>{2, 0, 0}));
  // a NaN late in a long row, past the first chunk
  Tensor longrow = zeros({100000});
  longrow.narrow(0, 77777, 1).fill_(nan);
  EXPECT_TRUE(std::isnan(longrow.max().item<float>()));
  EXPECT_EQ(argmax(longrow, 0).item<int64_t>(), 77777);
  EXPECT_EQ(argmin(longrow, 0).item<int64_t>(), 77777);
}

TEST(Reduce, SizeZeroDims) {
  Tensor x = zeros({3, 0, 2});
  EXPECT_EQ(sum(x, {1}).shape(), (Shape{3, 2}));
  EXPECT_EQ(sum(x, {1}).to_vector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(sum(x).item<float>(), 0.0f);
  for (float v : mean(x, {1}).to_vector<float>()) EXPECT_TRUE(std::isnan(v));
  EXPECT_TRUE(std::isnan(var(x, {1}).to_vector<float>()[0]));
  // reducing a non-empty dim of an empty tensor gives an empty result, no error
  EXPECT_EQ(amax(x, {2}).shape(), (Shape{3, 0}));
  EXPECT_EQ(argmax(x, 0, true).shape(), (Shape{1, 0, 2}));
  EXPECT_EQ(sum(x, {0}, true).shape(), (Shape{1, 0, 2}));
  EXPECT_EMBER_ERROR(amax(x, {1}), "amax", "size 0", "[3, 0, 2]");
  EXPECT_EMBER_ERROR(amin(x), "amin", "[3, 0, 2]");
  EXPECT_EMBER_ERROR(argmax(x, 1), "argmax", "size 0", "[3, 0, 2]");
  EXPECT_EMBER_ERROR(argmin(x, -2), "argmin", "[3, 0, 2]");
  EXPECT_EMBER_ERROR(x.max(), "amax", "[3, 0, 2]");
}

TEST(Reduce, ScalarAndSizeOneInputs) {
  Tensor s = scalar_tensor(3.5);
  EXPECT_EQ(sum(s).item<float>(), 3.5f);
  EXPECT_EQ(sum(s).dim(), 0);
  EXPECT_EQ(sum(s, {0}).item<float>(), 3.5f);
  EXPECT_EQ(mean(s, {-1}, true).dim(), 0);
  EXPECT_EQ(amax(s).item<float>(), 3.5f);
  EXPECT_EQ(argmax(s, 0).item<int64_t>(), 0);
  EXPECT_TRUE(std::isnan(var(s).item<float>()));  // N - 1 = 0
  EXPECT_EQ(var(s, {}, 0).item<float>(), 0.0f);
  Tensor one = full({1, 1, 1}, 2.0);
  EXPECT_EQ(sum(one, {1}).shape(), (Shape{1, 1}));
  EXPECT_EQ(sum(one, {0, 2}, true).shape(), (Shape{1, 1, 1}));
  EXPECT_EQ(mean(one).item<float>(), 2.0f);
}

TEST(Reduce, VarianceCorrectionMatchesDefinition) {
  Tensor x = from_vector<double>({1, 2, 3, 4, 5, 7}, {2, 3});
  EXPECT_EQ(var(x, {1}).to_vector<double>(), (std::vector<double>{1.0, 7.0 / 3.0}));
  EXPECT_EQ(var(x, {1}, 0).to_vector<double>(), (std::vector<double>{2.0 / 3.0, 14.0 / 9.0}));
  EXPECT_NEAR(x.var({0, 1}).item<double>(), 14.0 / 3.0, 1e-12);
  // correction larger than N: division by zero, as in PyTorch
  EXPECT_TRUE(std::isinf(var(from_vector<double>({1, 2}), {}, 3).item<double>()));
  // a large common offset does not destroy the variance
  Tensor shifted = random_tensor({1000}, DType::f32) + 1e4;
  EXPECT_TRUE(all_close(var(shifted), reference::var(reference::from_tensor(shifted), {}, 1, false), 1e-5, 0));
}

TEST(Reduce, TensorMembersForwardToTheOps) {
  Tensor x = random_tensor({3, 4}, DType::f32);
  const RefTensor rx = reference::from_tensor(x);
  EXPECT_TRUE(all_close(x.sum(), reference::sum(rx, {}, false), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(x.sum({1}, true), reference::sum(rx, {1}, true), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(x.mean(), reference::mean(rx, {}, false), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(x.mean({0}), reference::mean(rx, {0}, false), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(x.max(), reference::amax(rx, {}, false), 0, 0));
  EXPECT_TRUE(all_close(x.min(), reference::amin(rx, {}, false), 0, 0));
  EXPECT_TRUE(all_close(x.argmax(-1), reference::argmax(rx, -1, false), 0, 0));
  EXPECT_TRUE(all_close(x.var({1}, 0, true), reference::var(rx, {1}, 0, true), 1e-6, 1e-6));
}

TEST(Reduce, ErrorsNameTheOpAndShape) {
  Tensor x = zeros({2, 3});
  EXPECT_EMBER_ERROR(sum(x, {2}), "sum", "dim 2", "[2, 3]");
  EXPECT_EMBER_ERROR(sum(x, {-3}), "sum", "dim -3", "[2, 3]");
  EXPECT_EMBER_ERROR(mean(x, {0, -2}), "mean", "more than once", "[2, 3]");
  EXPECT_EMBER_ERROR(amax(x, {5}), "amax", "[2, 3]");
  EXPECT_EMBER_ERROR(amin(x, {1, 1}), "amin", "[2, 3]");
  EXPECT_EMBER_ERROR(argmax(x, 2), "argmax", "dim 2", "[2, 3]");
  EXPECT_EMBER_ERROR(argmin(x, -3), "argmin", "[2, 3]");
  EXPECT_EMBER_ERROR(var(x, {7}), "var", "[2, 3]");
  EXPECT_EMBER_ERROR(var(x, {}, -1), "var", "correction");
  Tensor i = zeros({2, 3}, {DType::i64});
  EXPECT_EMBER_ERROR(mean(i), "mean", "int64", "[2, 3]");
  EXPECT_EMBER_ERROR(var(i), "var", "int64", "[2, 3]");
  EXPECT_EMBER_ERROR(sum(scalar_tensor(1.0), {1}), "sum", "dim 1");
}

// ---- backward

namespace {

using Fn = std::function<Tensor(const Tensor&)>;

void expect_gradcheck(const Fn& f, const Tensor& x, const std::string& what) {
  auto r = gradcheck([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0])}; },
                     {x.detach().requires_grad_()});
  EXPECT_TRUE(r.ok) << what << ": " << r.message;
}

}  // namespace

TEST(Reduce, GradcheckSumMeanVar) {
  for (int trial = 0; trial < 8; ++trial) {
    const int ndim = uniform_int(1, 3);
    const Shape shape = random_shape(ndim, 4);
    const Shape dims = random_dims(ndim);
    const bool keepdim = coin();
    const bool non_contiguous = coin();
    const std::string what = describe(shape, dims, keepdim, non_contiguous, DType::f64);
    Tensor x = random_tensor(shape, DType::f64, non_contiguous);
    expect_gradcheck([&](const Tensor& t) { return sum(t, dims, keepdim); }, x, "sum " + what);
    expect_gradcheck([&](const Tensor& t) { return mean(t, dims, keepdim); }, x, "mean " + what);
    const int64_t correction = uniform_int(0, 1);
    if (reduced_count(shape, dims) > correction)
      expect_gradcheck([&](const Tensor& t) { return var(t, dims, correction, keepdim); }, x, "var " + what);
  }
}

TEST(Reduce, GradcheckAmaxAmin) {
  for (int trial = 0; trial < 8; ++trial) {
    const int ndim = uniform_int(1, 3);
    const Shape shape = random_shape(ndim, 4);
    const Shape dims = random_dims(ndim);
    const bool keepdim = coin();
    const std::string what = describe(shape, dims, keepdim, false, DType::f64);
    // distinct, well-separated values so finite differences never cross a tie
    Tensor perm = arange(double(numel_of(shape)), 0.0, -1.0, {DType::f64});
    Tensor x = (perm * 0.37).reshape(shape);
    expect_gradcheck([&](const Tensor& t) { return amax(t, dims, keepdim); }, x, "amax " + what);
    expect_gradcheck([&](const Tensor& t) { return amin(t, dims, keepdim); }, x, "amin " + what);
  }
}

TEST(Reduce, AmaxGradientIsSharedAmongTies) {
  Tensor x = from_vector<double>({1, 3, 3, 2, 0, 2}, {2, 3}).requires_grad_();
  amax(x, {1}).sum().backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0.5, 0.5, 0.5, 0, 0.5}));
  Tensor y = from_vector<double>({4, 1, 4, 4}).requires_grad_();
  (y.min() * 3.0).backward();
  EXPECT_EQ(y.grad().to_vector<double>(), (std::vector<double>{0, 3, 0, 0}));
}

TEST(Reduce, BackwardShapesAndValues) {
  Tensor x = random_tensor({2, 3, 4}, DType::f32).requires_grad_();
  Tensor g = random_tensor({2, 4}, DType::f32);
  sum(x, {1}).backward(g);
  // every element of x gets the gradient of the output element it was summed into
  Tensor expect = g.unsqueeze(1).expand({2, 3, 4}).contiguous();
  EXPECT_TRUE(all_close(x.grad(), expect, 0, 0));
  Tensor z = random_tensor({5, 2}, DType::f32).requires_grad_();
  z.mean().backward();
  EXPECT_TRUE(all_close(z.grad(), full({5, 2}, 0.1), 1e-7, 0));
}
