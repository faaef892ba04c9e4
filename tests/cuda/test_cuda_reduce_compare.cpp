// CUDA reductions (sum, mean, amax, amin, argmax, argmin, var) and the selecting elementwise ops
// (comparisons, where, masked_fill) against the double reference, in every dtype the CPU
// kernels take. Reductions cover rows short enough for a warp and longer than a block, rows and
// columns long enough to be split across blocks, middle and all-dim reductions, size-1 and empty
// reductions, non-contiguous inputs, NaN propagation and ties for argmax/argmin. Kernel outputs
// start out poisoned (NaN, a sentinel for integers, both values for bools) so that an element
// the kernel never wrote shows. Every test skips without a CUDA device.
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/device_api.h"
#include "core/native/elementwise.h"
#include "core/native/reduce.h"
#include "kernels/reference/elementwise.h"
#include "kernels/reference/reduce.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::tolerance;
using ember::testing::uniform_int;
using native::CompareOp;
using native::ReduceKind;
using reference::RefTensor;

namespace {

const Device kGpu = Device::cuda(0);
const double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kIntPoison = -777.0;

const std::vector<DType> kAllTypes = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                      DType::i32, DType::i64, DType::boolean};

enum class Fill { Uniform, Ties };

double uniform_real(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(ember::testing::rng()); }

// Random CPU values of dtype: uniform floats in [-2, 2), or small integers (many ties); integer
// dtypes get integers in [-1000, 1000] (Uniform) or [-3, 3] (Ties); bools are fair coins. A
// fraction nan_rate of floating elements is NaN.
Tensor make_values(const Shape& shape, DType dt, Fill fill, double nan_rate = 0.0) {
  RefTensor r(shape);
  for (double& v : r.data) {
    if (dt == DType::boolean) v = double(uniform_int(0, 1));
    else if (fill == Fill::Ties) v = double(uniform_int(-3, 3));
    else if (is_floating(dt)) v = uniform_real(-2.0, 2.0);
    else v = double(uniform_int(-1000, 1000));
    if (nan_rate > 0 && is_floating(dt) && uniform_real(0.0, 1.0) < nan_rate) v = kNaN;
  }
  return reference::to_tensor(r, dt);
}

// The values of `cpu` on the GPU; with nc, a strided view (a step-2 slice of the last dim of a
// wider buffer, transposed when 2-D or more) instead of a contiguous tensor.
Tensor gpu_view(const Tensor& cpu, bool nc) {
  const Shape& shape = cpu.shape();
  if (!nc || shape.empty()) return cpu.to(kGpu);
  const size_t nd = shape.size();
  Tensor t = cpu;
  if (nd >= 2) t = t.transpose(-1, -2);  // stored transposed: the view transposes it back
  // widen the stored last dim, the real values at the even positions
  Shape wide = t.shape();
  wide.back() *= 2;
  RefTensor big(wide, 0.0);
  const RefTensor vals = reference::from_tensor(t);
  for (int64_t i = 0; i < vals.numel(); ++i) big.data[size_t(2 * i)] = vals.data[size_t(i)];
  Tensor g = reference::to_tensor(big, cpu.dtype()).to(kGpu).slice(-1, 0, wide.back(), 2);
  if (nd >= 2) g = g.transpose(-1, -2);
  return g;
}

Tensor random_gpu(const Shape& shape, DType dt, bool nc, Fill fill = Fill::Uniform, double nan_rate = 0.0) {
  return gpu_view(make_values(shape, dt, fill, nan_rate), nc);
}

double poison_for(DType dt) { return is_floating(dt) ? kNaN : kIntPoison; }

std::string label(const std::string& what, DType dt, const Shape& shape, const Shape& dims, bool nc) {
  return what + " " + dtype_name(dt) + " " + shape_str(shape) + " dims " + shape_str(dims) + (nc ? " strided" : "");
}

// ---- reductions

struct ReduceCase {
  Shape shape;
  Shape dims;  // empty: every dim
  bool nc = false;
};

std::vector<ReduceCase> reduce_cases() {
  std::vector<ReduceCase> cases = {
      {{1000, 5}, {1}},           // very short rows: one thread each
      {{3, 16}, {1}},             // the longest row a thread takes
      {{5, 37}, {1}},             // rows, one warp each, partly idle
      {{4, 1024}, {1}},           // the longest row a warp takes
      {{3, 1025}, {1}},           // the shortest row a block takes
      {{2, 20000}, {1}},          // few long rows: split across blocks
      {{70000}, {}},              // one row, split into chunks
      {{600, 300}, {1}},          // many rows, no split
      {{7, 9, 5}, {1}},           // middle dim: columns
      {{300, 6}, {0}},            // leading dim, few columns: split
      {{5000, 3}, {0}},           // long columns, split
      {{3, 200, 70}, {1}},        // columns over several outer slices
      {{2, 33000}, {0}},          // many columns, no split
      {{4, 3, 6, 2}, {1, 2}},     // two adjacent middle dims
      {{4, 3, 6}, {0, 2}},        // non-adjacent dims: permuted copy
      {{6, 1, 4}, {1}},           // size-1 reduced dim
      {{1, 1}, {}},               // a single element
      {{}, {}},                   // 0-d
      {{5, 8}, {0, 1}},           // all dims, listed
      {{9, 11}, {0}, true},       // strided input
      {{6, 50, 4}, {1}, true},    // strided input, middle dim
      {{3, 2000}, {1}, true},     // strided input, long rows
  };
  for (int k = 0; k < 4; ++k) {
    const Shape shape = ember::testing::random_shape(int(uniform_int(1, 4)), 9);
    Shape dims;
    for (int64_t d = 0; d < int64_t(shape.size()); ++d)
      if (ember::testing::coin()) dims.push_back(d);
    cases.push_back({shape, dims, ember::testing::coin()});
  }
  return cases;
}

// Runs the reduce stub on a poisoned output of dtype out_dt; the geometry comes from the same
// helpers as the public functions.
Tensor stub_reduce(ReduceKind kind, const Tensor& x, const Shape& dims, DType out_dt) {
  const Shape d = native::reduction_dims(dims, x.shape(), "test");
  Tensor out = full(native::reduced_shape(x.shape(), d, false), poison_for(out_dt), {out_dt, kGpu});
  if (out.numel() > 0) native::reduce_stub.call(kGpu, "test")(out, native::reduce_geometry(x, d), kind);
  return out;
}

Tensor stub_arg(bool is_max, const Tensor& x, int64_t dim) {
  const Shape d = native::reduction_dims({dim}, x.shape(), "test");
  Tensor out = full(native::reduced_shape(x.shape(), d, false), kIntPoison, {DType::i64, kGpu});
  if (out.numel() > 0) native::arg_reduce_stub.call(kGpu, "test")(out, native::reduce_geometry(x, d), is_max);
  return out;
}

Tensor stub_var(const Tensor& x, const Shape& dims, int64_t correction) {
  const Shape d = native::reduction_dims(dims, x.shape(), "test");
  Tensor out = full(native::reduced_shape(x.shape(), d, false), kNaN, {x.dtype(), kGpu});
  if (out.numel() > 0) native::var_stub.call(kGpu, "test")(out, native::reduce_geometry(x, d), correction);
  return out;
}

DType sum_dtype(DType dt) { return is_floating(dt) ? dt : DType::i64; }

}  // namespace

TEST(CudaReduce, SumAndMeanMatchReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (const ReduceCase& k : reduce_cases()) {
    for (DType dt : kAllTypes) {
      SCOPED_TRACE(label("sum/mean", dt, k.shape, k.dims, k.nc));
      const Tensor x = random_gpu(k.shape, dt, k.nc);
      const RefTensor rx = reference::from_tensor(x);
      const double tol = tolerance(dt);
      EXPECT_TRUE(all_close(stub_reduce(ReduceKind::sum, x, k.dims, sum_dtype(dt)), reference::sum(rx, k.dims, false),
                            tol, tol));
      if (is_floating(dt)) {
        EXPECT_TRUE(all_close(stub_reduce(ReduceKind::mean, x, k.dims, dt), reference::mean(rx, k.dims, false), tol, tol));
        // the public functions, with keepdim, and the CPU kernel on the same values
        const Tensor got = native::mean(x, k.dims, true);
        EXPECT_TRUE(all_close(got, reference::mean(rx, k.dims, true), tol, tol));
        EXPECT_TRUE(all_close(got, native::mean(x.to(Device::cpu()), k.dims, true), tol, tol));
      }
      const Tensor got_sum = native::sum(x, k.dims, true);
      EXPECT_EQ(got_sum.dtype(), sum_dtype(dt));
      EXPECT_TRUE(all_close(got_sum, reference::sum(rx, k.dims, true), tol, tol));
    }
  }
}

TEST(CudaReduce, AmaxAminMatchReferenceWithNaN) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (const ReduceCase& k : reduce_cases()) {
    if (numel_of(k.shape) == 0) continue;
    for (DType dt : kAllTypes) {
      for (double nan_rate : {0.0, 0.002, 0.2}) {
        if (nan_rate > 0 && !is_floating(dt)) continue;
        SCOPED_TRACE(label("amax/amin nan_rate " + std::to_string(nan_rate), dt, k.shape, k.dims, k.nc));
        const Tensor x = random_gpu(k.shape, dt, k.nc, Fill::Uniform, nan_rate);
        const RefTensor rx = reference::from_tensor(x);
        // extremes are input values: exact in every dtype
        EXPECT_TRUE(all_close(stub_reduce(ReduceKind::amax, x, k.dims, dt), reference::amax(rx, k.dims, false), 0, 0));
        EXPECT_TRUE(all_close(stub_reduce(ReduceKind::amin, x, k.dims, dt), reference::amin(rx, k.dims, false), 0, 0));
        EXPECT_TRUE(all_close(native::amax(x, k.dims, true), reference::amax(rx, k.dims, true), 0, 0));
      }
    }
  }
}

TEST(CudaReduce, BoolAmaxAminAreAnyAndAll) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  // bool outputs cannot be poisoned with a value they never take, so check both fills
  for (double fill : {0.0, 1.0}) {
    RefTensor r({4, 3000}, fill);
    r.data[size_t(1 * 3000 + 2500)] = 1.0 - fill;  // row 1 differs at one late element
    const Tensor x = reference::to_tensor(r, DType::boolean).to(kGpu);
    const std::vector<double> mx = native::amax(x, {1}, false).to_vector<double>();
    const std::vector<double> mn = native::amin(x, {1}, false).to_vector<double>();
    for (size_t row = 0; row < 4; ++row) {
      const bool mixed = row == 1;
      EXPECT_EQ(mx[row], mixed ? 1.0 : fill) << "row " << row;
      EXPECT_EQ(mn[row], mixed ? 0.0 : fill) << "row " << row;
    }
  }
}

TEST(CudaReduce, ArgmaxArgminFirstOnTiesNaNWins) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  struct ArgCase {
    Shape shape;
    int64_t dim;
    bool nc;
  };
  std::vector<ArgCase> cases = {
      {{900, 7}, 1, false},  {{5, 37}, 1, false},  {{3, 1025}, 1, false},  {{2, 40000}, 1, false},
      {{70000}, 0, false},   {{7, 9, 5}, 1, false}, {{5000, 3}, 0, false},  {{300, 6}, 0, false},
      {{4, 1, 3}, 1, false}, {{}, 0, false},        {{9, 11}, 0, true},     {{6, 50, 4}, 2, true},
      {{3, 2000}, -1, true}};
  for (int k = 0; k < 4; ++k) {
    const Shape shape = ember::testing::random_shape(int(uniform_int(1, 4)), 9);
    cases.push_back({shape, uniform_int(0, int64_t(shape.size()) - 1), ember::testing::coin()});
  }
  for (const ArgCase& k : cases) {
    for (DType dt : kAllTypes) {
      for (double nan_rate : {0.0, 0.001, 0.3}) {
        if (nan_rate > 0 && !is_floating(dt)) continue;
        SCOPED_TRACE(label("argmax/argmin nan_rate " + std::to_string(nan_rate), dt, k.shape, {k.dim}, k.nc));
        // few distinct values: every row has ties
        const Tensor x = random_gpu(k.shape, dt, k.nc, Fill::Ties, nan_rate);
        const RefTensor rx = reference::from_tensor(x);
        EXPECT_TRUE(all_close(stub_arg(true, x, k.dim), reference::argmax(rx, k.dim, false), 0, 0));
        EXPECT_TRUE(all_close(stub_arg(false, x, k.dim), reference::argmin(rx, k.dim, false), 0, 0));
        EXPECT_TRUE(all_close(native::argmax(x, k.dim, true), reference::argmax(rx, k.dim, true), 0, 0));
      }
    }
  }
}

TEST(CudaReduce, NaNInLongRowsAndColumnsIsFound) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  // rows and columns long enough to be split across blocks; NaNs in late chunks
  const int64_t len = 50000;
  for (DType dt : ember::testing::kFloatTypes) {
    for (bool rows : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (rows ? " rows" : " columns"));
      RefTensor r(rows ? Shape{3, len} : Shape{len, 3});
      for (double& v : r.data) v = uniform_real(-1.0, 1.0);
      auto at = [&](int64_t line, int64_t i) -> double& {
        return r.data[size_t(rows ? line * len + i : i * 3 + line)];
      };
      at(1, 41000) = kNaN;  // first NaN of line 1
      at(1, 45000) = kNaN;
      at(2, 49999) = kNaN;  // the very last element of line 2
      at(0, 30000) = 5.0;   // a unique maximum of line 0, twice
      at(0, 30001) = 5.0;
      const Tensor x = reference::to_tensor(r, dt).to(kGpu);
      const int64_t dim = rows ? 1 : 0;
      const std::vector<double> s = stub_reduce(ReduceKind::sum, x, {dim}, dt).to_vector<double>();
      const std::vector<double> mx = stub_reduce(ReduceKind::amax, x, {dim}, dt).to_vector<double>();
      const std::vector<double> mn = stub_reduce(ReduceKind::amin, x, {dim}, dt).to_vector<double>();
      const std::vector<double> am = stub_arg(true, x, dim).to_vector<double>();
      const std::vector<double> an = stub_arg(false, x, dim).to_vector<double>();
      EXPECT_FALSE(std::isnan(s[0]));
      EXPECT_TRUE(std::isnan(s[1]) && std::isnan(s[2]));
      EXPECT_EQ(mx[0], 5.0);
      EXPECT_TRUE(std::isnan(mx[1]) && std::isnan(mx[2]) && std::isnan(mn[1]) && std::isnan(mn[2]));
      EXPECT_EQ(am[0], 30000.0);
      EXPECT_EQ(am[1], 41000.0);
      EXPECT_EQ(an[1], 41000.0);
      EXPECT_EQ(am[2], 49999.0);
      EXPECT_EQ(an[2], 49999.0);
    }
  }
}

TEST(CudaReduce, VarMatchesReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (const ReduceCase& k : reduce_cases()) {
    for (DType dt : ember::testing::kFloatTypes) {
      for (int64_t correction : {0, 1, 2}) {
        SCOPED_TRACE(label("var correction " + std::to_string(correction), dt, k.shape, k.dims, k.nc));
        // an offset mean checks that deviations are taken from the mean, not accumulated raw
        RefTensor r(k.shape);
        for (double& v : r.data) v = 100.0 + uniform_real(-2.0, 2.0);
        const Tensor x = gpu_view(reference::to_tensor(r, dt), k.nc);
        const RefTensor rx = reference::from_tensor(x);
        const RefTensor want = reference::var(rx, k.dims, correction, false);
        const double tol = tolerance(dt);
        EXPECT_TRUE(all_close(stub_var(x, k.dims, correction), want, tol, tol));
        EXPECT_TRUE(all_close(native::var(x, k.dims, correction, false), want, tol, tol));
      }
    }
  }
}

TEST(CudaReduce, EmptyReductions) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kAllTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = make_values({3, 0, 4}, dt, Fill::Uniform).to(kGpu);
    const RefTensor zeros({3, 4}, 0.0);
    EXPECT_TRUE(all_close(stub_reduce(ReduceKind::sum, x, {1}, sum_dtype(dt)), zeros, 0, 0));
    EXPECT_TRUE(all_close(native::sum(x, {1}, false), zeros, 0, 0));
    if (is_floating(dt)) {
      const RefTensor nans({3, 4}, kNaN);
      // poisoned with 0 so that a NaN must come from the kernel
      Tensor out = full({3, 4}, 0.0, {dt, kGpu});
      native::reduce_stub.call(kGpu, "test")(out, native::reduce_geometry(x, {1}), ReduceKind::mean);
      EXPECT_TRUE(all_close(out, nans, 0, 0));
      out = full({3, 4}, 0.0, {dt, kGpu});
      native::var_stub.call(kGpu, "test")(out, native::reduce_geometry(x, {1}), 1);
      EXPECT_TRUE(all_close(out, nans, 0, 0));
      EXPECT_TRUE(all_close(native::var(x, {1}, 0, false), nans, 0, 0));
    }
    EXPECT_EMBER_ERROR(native::amax(x, {1}, false), "amax", "size 0");
    EXPECT_EMBER_ERROR(native::argmin(x, 1, false), "argmin", "size 0");
    // an empty output needs no kernel at all
    EXPECT_EQ(native::sum(x, {2}, false).shape(), (Shape{3, 0}));
    EXPECT_EQ(native::amax(x, {0}, false).shape(), (Shape{0, 4}));
  }
}

TEST(CudaReduce, SplitReductionsAreDeterministic) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (const Shape& shape : {Shape{1, 1 << 20}, Shape{1 << 18, 5}}) {
    for (DType dt : {DType::f32, DType::f16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(shape));
      const Tensor x = random_gpu(shape, dt, false);
      const int64_t dim = shape[0] == 1 ? 1 : 0;
      const std::vector<double> first = native::sum(x, {dim}, false).to_vector<double>();
      const std::vector<double> first_var = native::var(x, {dim}, 1, false).to_vector<double>();
      for (int rep = 0; rep < 3; ++rep) {
        EXPECT_EQ(native::sum(x, {dim}, false).to_vector<double>(), first);
        EXPECT_EQ(native::var(x, {dim}, 1, false).to_vector<double>(), first_var);
      }
      const RefTensor rx = reference::from_tensor(x);
      EXPECT_TRUE(all_close(native::sum(x, {dim}, false), reference::sum(rx, {dim}, false), tolerance(dt), tolerance(dt)));
    }
  }
}

TEST(CudaReduce, RejectsBadInput) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Tensor xi = make_values({4, 5}, DType::i32, Fill::Uniform).to(kGpu);
  EXPECT_EMBER_ERROR(native::mean(xi, {1}, false), "mean", "floating-point");
  EXPECT_EMBER_ERROR(native::var(xi, {1}, 1, false), "var", "floating-point");
  Tensor out = full({4}, 0.0, {DType::i32, kGpu});
  // integer sums are written as int64 only
  EXPECT_EMBER_ERROR(native::reduce_stub.call(kGpu, "test")(out, native::reduce_geometry(xi, {1}), ReduceKind::sum),
                     "sum", "int64");
  out = full({4}, 0.0, {DType::i64, kGpu});
  EXPECT_EMBER_ERROR(native::reduce_stub.call(kGpu, "test")(out, native::reduce_geometry(xi, {1}), ReduceKind::mean),
                     "mean", "floating-point");
}

// ---- comparisons, where, masked_fill

namespace {

RefTensor reference_compare(CompareOp op, const RefTensor& a, const RefTensor& b) {
  switch (op) {
    case CompareOp::Eq: return reference::eq(a, b);
    case CompareOp::Ne: return reference::ne(a, b);
    case CompareOp::Lt: return reference::lt(a, b);
    case CompareOp::Le: return reference::le(a, b);
    case CompareOp::Gt: return reference::gt(a, b);
    case CompareOp::Ge: return reference::ge(a, b);
  }
  return {};
}

const std::vector<CompareOp> kCompareOps = {CompareOp::Eq, CompareOp::Ne, CompareOp::Lt,
                                            CompareOp::Le, CompareOp::Gt, CompareOp::Ge};

// A shape that broadcasts to `shape`: some dims set to 1, some leading dims dropped.
Shape broadcastable_to(const Shape& shape) {
  Shape s = shape;
  for (int64_t& d : s)
    if (uniform_int(0, 2) == 0) d = 1;
  s.erase(s.begin(), s.begin() + uniform_int(0, int64_t(s.size())));
  return s;
}

std::vector<Shape> output_shapes() {
  std::vector<Shape> shapes = {{}, {1}, {7}, {3, 5}, {4, 1, 6}, {2, 3, 4, 5}, {3, 700}, {2, 0, 3}};
  for (int k = 0; k < 4; ++k) shapes.push_back(ember::testing::random_shape(int(uniform_int(1, 4)), 6));
  return shapes;
}

// Runs `stub(out)` on an output poisoned with false, then with true: both must give `want`.
template <typename Stub>
void expect_bool_stub(const Shape& shape, const RefTensor& want, const Stub& stub) {
  for (double poison : {0.0, 1.0}) {
    const Tensor out = full(shape, poison, {DType::boolean, kGpu});
    stub(out);
    EXPECT_TRUE(all_close(out, want, 0, 0)) << "output poisoned with " << poison;
  }
}

}  // namespace

TEST(CudaCompare, TensorTensorMatchesReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (const Shape& shape : output_shapes()) {
    for (DType dt : kAllTypes) {
      const Shape sa = ember::testing::coin() ? shape : broadcastable_to(shape);
      const Shape sb = broadcastable_to(shape);
      const bool nc = ember::testing::coin();
      SCOPED_TRACE(label("compare", dt, sa, sb, nc));
      // few distinct values, so that equality holds often; NaN never compares true except Ne
      const Tensor a = random_gpu(sa, dt, nc, Fill::Ties, 0.1);
      const Tensor b = random_gpu(sb, dt, !nc, Fill::Ties, 0.1);
      const RefTensor ra = reference::from_tensor(a), rb = reference::from_tensor(b);
      for (CompareOp op : kCompareOps) {
        SCOPED_TRACE(native::op_name(op));
        const RefTensor want = reference_compare(op, ra, rb);
        expect_bool_stub(want.shape, want, [&](const Tensor& out) {
          native::compare_stub.call(kGpu, "test")(op, out, a, b);
        });
        const Tensor got = native::compare(op, a, b);
        EXPECT_EQ(got.dtype(), DType::boolean);
        EXPECT_TRUE(all_close(got, want, 0, 0));
      }
    }
  }
}

TEST(CudaCompare, ScalarMatchesReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (const Shape& shape : output_shapes()) {
    for (DType dt : kAllTypes) {
      for (double s : {0.1, -1.0, 2.5, 0.0, 1.0, kNaN}) {
        const bool nc = ember::testing::coin();
        SCOPED_TRACE(label("compare scalar " + std::to_string(s), dt, shape, {}, nc));
        // plant the scalar itself (rounded to dt) among small integers
        RefTensor r = reference::from_tensor(make_values(shape, dt, Fill::Ties, 0.05));
        for (double& v : r.data)
          if (uniform_int(0, 3) == 0 && !std::isnan(s)) v = s;
        const Tensor a = gpu_view(reference::to_tensor(r, dt), nc);
        const RefTensor ra = reference::from_tensor(a);
        // floating tensors compare with the scalar rounded to their dtype; integers exactly
        const double sv = is_floating(dt) ? full({}, s, {dt}).item_double() : s;
        const RefTensor rs({}, sv);
        for (CompareOp op : kCompareOps) {
          SCOPED_TRACE(native::op_name(op));
          const RefTensor want = reference_compare(op, ra, rs);
          expect_bool_stub(shape, want, [&](const Tensor& out) {
            native::compare_scalar_stub.call(kGpu, "test")(op, out, a, s);
          });
          EXPECT_TRUE(all_close(native::compare(op, a, s), want, 0, 0));
        }
      }
    }
  }
}

TEST(CudaCompare, FloatEqualsScalarItWasSetFrom) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : ember::testing::kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = full({5, 3}, 0.1, {dt, kGpu});
    EXPECT_TRUE(all_close(native::compare(CompareOp::Eq, x, 0.1), RefTensor({5, 3}, 1.0), 0, 0));
    EXPECT_TRUE(all_close(native::compare(CompareOp::Lt, x, 0.1), RefTensor({5, 3}, 0.0), 0, 0));
  }
  // integers compare exactly: 2 < 2.5, 2 != 2.5
  const Tensor xi = full({4}, 2.0, {DType::i64, kGpu});
  EXPECT_TRUE(all_close(native::compare(CompareOp::Lt, xi, 2.5), RefTensor({4}, 1.0), 0, 0));
  EXPECT_TRUE(all_close(native::compare(CompareOp::Eq, xi, 2.5), RefTensor({4}, 0.0), 0, 0));
}

TEST(CudaWhere, MatchesReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (const Shape& shape : output_shapes()) {
    for (DType dt : kAllTypes) {
      const Shape sc = broadcastable_to(shape), sa = broadcastable_to(shape);
      const Shape sb = ember::testing::coin() ? shape : broadcastable_to(shape);
      const bool nc = ember::testing::coin();
      SCOPED_TRACE(label("where", dt, shape, sc, nc));
      const Tensor cond = random_gpu(sc, DType::boolean, nc);
      const Tensor a = random_gpu(sa, dt, !nc, Fill::Uniform, 0.1);
      const Tensor b = random_gpu(sb, dt, nc, Fill::Uniform, 0.1);
      const RefTensor want =
          reference::where(reference::from_tensor(cond), reference::from_tensor(a), reference::from_tensor(b));
      // values are copied: exact, NaNs included
      const Tensor got = native::where(cond, a, b);
      EXPECT_TRUE(all_close(got, want, 0, 0));
      const Tensor out = full(want.shape, poison_for(dt), {dt, kGpu});
      native::where_stub.call(kGpu, "test")(out, cond, a, b);
      if (dt == DType::boolean) {
        // a bool poison is a value too: run again over the opposite fill
        EXPECT_TRUE(all_close(out, want, 0, 0));
        const Tensor out0 = full(want.shape, 0.0, {dt, kGpu});
        native::where_stub.call(kGpu, "test")(out0, cond, a, b);
        EXPECT_TRUE(all_close(out0, want, 0, 0));
      } else {
        EXPECT_TRUE(all_close(out, want, 0, 0));
      }
    }
  }
}

TEST(CudaMaskedFill, MatchesReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (const Shape& shape : output_shapes()) {
    for (DType dt : kAllTypes) {
      std::vector<double> values;
      if (is_floating(dt)) values = {-1.5, 0.3, kNaN};
      else if (dt == DType::boolean) values = {0.0, 1.0};
      else values = {7.0, -123456.0};
      for (double value : values) {
        const bool nc = ember::testing::coin();
        const Shape sm = broadcastable_to(shape);
        SCOPED_TRACE(label("masked_fill " + std::to_string(value), dt, shape, sm, nc));
        const Tensor x = random_gpu(shape, dt, nc, Fill::Uniform, 0.05);
        const Tensor mask = random_gpu(sm, DType::boolean, !nc);
        // the value as the dtype stores it
        const double stored = full({}, value, {dt}).item_double();
        const RefTensor want = reference::masked_fill(reference::from_tensor(x), reference::from_tensor(mask), stored);
        EXPECT_TRUE(all_close(native::masked_fill(x, mask, value), want, 0, 0));
        for (double poison : {poison_for(dt), 0.0, 1.0}) {
          const Tensor out = full(shape, poison, {dt, kGpu});
          native::masked_fill_stub.call(kGpu, "test")(out, x, mask, value);
          EXPECT_TRUE(all_close(out, want, 0, 0)) << "output poisoned with " << poison;
        }
      }
    }
  }
}

TEST(CudaMaskedFill, InPlaceOverItsInput) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Tensor x = random_gpu({6, 9}, DType::f32, false);
  const Tensor mask = random_gpu({9}, DType::boolean, false);
  const RefTensor want = reference::masked_fill(reference::from_tensor(x), reference::from_tensor(mask), 4.0);
  native::masked_fill_stub.call(kGpu, "test")(x, x, mask, 4.0);
  EXPECT_TRUE(all_close(x, want, 0, 0));
}

TEST(CudaWhere, RejectsBadOperands) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Tensor a = random_gpu({3, 4}, DType::f32, false);
  const Tensor fcond = random_gpu({3, 4}, DType::f32, false);
  const Tensor out = full({3, 4}, kNaN, {DType::f32, kGpu});
  EXPECT_EMBER_ERROR(native::where_stub.call(kGpu, "test")(out, fcond, a, a), "where", "bool");
  EXPECT_EMBER_ERROR(native::masked_fill_stub.call(kGpu, "test")(out, a, fcond, 1.0), "masked_fill", "bool");
  EXPECT_EMBER_ERROR(native::where(fcond, a, a), "where", "bool");
}
