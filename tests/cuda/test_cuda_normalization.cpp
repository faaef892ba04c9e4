// CUDA softmax, log-softmax and layer norm, forward and backward, against the double
// reference: rows short enough for one warp and longer than a block, size-1 dims, softmax
// along non-last dims, optional weight, bias and gradients, every float dtype. Outputs start
// out poisoned with NaN so that an element the kernel never wrote shows. Every test skips
// without a CUDA device.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/device_api.h"
#include "core/native/normalization.h"
#include "kernels/reference/normalization.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_tensor;
using ember::testing::tolerance;
using ember::testing::uniform_int;

namespace {

const Device kGpu = Device::cuda(0);
const double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kEps = 1e-5;

struct SoftmaxCase {
  Shape shape;
  int64_t dim;
};

std::vector<SoftmaxCase> softmax_cases() {
  std::vector<SoftmaxCase> cases = {
      {{3, 17}, 1},       // one warp per row, partly idle
      {{5, 32}, 1},       // exactly one warp
      {{4, 1024}, 1},     // the longest row a warp takes
      {{3, 1025}, 1},     // the shortest row a block takes
      {{2, 3000}, 1},     // several elements per thread of a block
      {{6, 1}, 1},        // size-1 softmax dim: all ones (zeros for log)
      {{1, 40}, 1},       // one row
      {{2, 7, 5}, 1},     // middle dim
      {{4, 1, 3}, 1},     // size-1 middle dim
      {{1300, 3}, 0},     // first dim, long columns
      {{3, 4, 2, 6}, 2},  // inner of 6 after the softmax dim
      {{2, 3, 1}, 1},     // last dim of size 1 after it: inner == 1 again
  };
  for (int k = 0; k < 4; ++k) {
    const Shape shape = ember::testing::random_shape(int(uniform_int(1, 4)), 9);
    cases.push_back({shape, uniform_int(0, int64_t(shape.size()) - 1)});
  }
  return cases;
}

native::SoftmaxGeometry geometry(const Shape& shape, int64_t dim) {
  native::SoftmaxGeometry g;
  for (int64_t d = 0; d < dim; ++d) g.outer *= shape[size_t(d)];
  g.len = shape[size_t(dim)];
  for (size_t d = size_t(dim) + 1; d < shape.size(); ++d) g.inner *= shape[d];
  return g;
}

std::string label(const char* what, DType dt, const Shape& shape, int64_t dim) {
  return std::string(what) + " " + dtype_name(dt) + " " + shape_str(shape) + " dim " + std::to_string(dim);
}

DType stats_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

// Per-row mean and rstd of a [rows, cols] reference tensor, biased variance.
void reference_stats(const reference::RefTensor& x, int64_t rows, int64_t cols, reference::RefTensor& mean,
                     reference::RefTensor& rstd) {
  mean = reference::RefTensor({rows});
  rstd = reference::RefTensor({rows});
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t c = 0; c < cols; ++c) s += x.data[size_t(r * cols + c)];
    const double m = s / double(cols);
    double v = 0;
    for (int64_t c = 0; c < cols; ++c) v += (x.data[size_t(r * cols + c)] - m) * (x.data[size_t(r * cols + c)] - m);
    mean.data[size_t(r)] = m;
    rstd.data[size_t(r)] = 1.0 / std::sqrt(v / double(cols) + kEps);
  }
}

struct LayerNormCase {
  int64_t rows, cols;
};

std::vector<LayerNormCase> layer_norm_cases() {
  std::vector<LayerNormCase> cases = {{7, 1}, {1, 31}, {9, 32}, {5, 33}, {3, 1024}, {4, 1025}, {2, 3000}, {700, 12},
                                      {40, 70}};
  for (int k = 0; k < 3; ++k) cases.push_back({uniform_int(1, 60), uniform_int(1, 200)});
  return cases;
}

Tensor to_gpu_or_undefined(const Tensor& t) { return t.defined() ? t.to(kGpu) : Tensor(); }

}  // namespace

TEST(CudaSoftmax, ForwardMatchesReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (const SoftmaxCase& k : softmax_cases()) {
    for (DType dt : ember::testing::kFloatTypes) {
      for (bool log : {false, true}) {
        SCOPED_TRACE(label(log ? "log_softmax" : "softmax", dt, k.shape, k.dim));
        const Tensor x = random_tensor(k.shape, dt, false, -4.0, 4.0);
        const Tensor out = full(k.shape, kNaN, {dt, kGpu});
        native::softmax_stub.call(kGpu, "softmax")(out, x.to(kGpu), geometry(k.shape, k.dim), log);
        const reference::RefTensor rx = reference::from_tensor(x);
        const reference::RefTensor want = log ? reference::log_softmax(rx, k.dim) : reference::softmax(rx, k.dim);
        const double tol = tolerance(dt);
        EXPECT_TRUE(all_close(out, want, tol, tol));
      }
    }
  }
}

TEST(CudaSoftmax, BackwardMatchesReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (const SoftmaxCase& k : softmax_cases()) {
    for (DType dt : ember::testing::kFloatTypes) {
      for (bool log : {false, true}) {
        SCOPED_TRACE(label(log ? "log_softmax_backward" : "softmax_backward", dt, k.shape, k.dim));
        const reference::RefTensor rx = reference::from_tensor(random_tensor(k.shape, DType::f64, false, -4.0, 4.0));
        // y rounded to dt, so that kernel and reference start from the same forward output
        const reference::RefTensor ry_exact = log ? reference::log_softmax(rx, k.dim) : reference::softmax(rx, k.dim);
        const Tensor y = reference::to_tensor(ry_exact, dt);
        const Tensor g = random_tensor(k.shape, dt);
        const Tensor gi = full(k.shape, kNaN, {dt, kGpu});
        native::softmax_backward_stub.call(kGpu, "softmax_backward")(gi, g.to(kGpu), y.to(kGpu),
                                                                     geometry(k.shape, k.dim), log);
        const reference::RefTensor rg = reference::from_tensor(g), ry = reference::from_tensor(y);
        const reference::RefTensor want =
            log ? reference::log_softmax_backward(rg, ry, k.dim) : reference::softmax_backward(rg, ry, k.dim);
        const double tol = tolerance(dt);
        EXPECT_TRUE(all_close(gi, want, tol, tol));
      }
    }
  }
}

TEST(CudaSoftmax, NaNFillsItsRowOnly) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : ember::testing::kFloatTypes) {
    for (int64_t len : {int64_t(20), int64_t(2000)}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " row of " + std::to_string(len));
      reference::RefTensor rx = reference::from_tensor(random_tensor({3, len}, DType::f64));
      rx.data[size_t(len + len / 2)] = kNaN;  // middle of row 1
      const Tensor xd = reference::to_tensor(rx, dt);
      const Tensor out = full({3, len}, 0.0, {dt, kGpu});
      native::softmax_stub.call(kGpu, "softmax")(out, xd.to(kGpu), geometry({3, len}, 1), false);
      const std::vector<double> got = out.to_vector<double>();
      for (int64_t i = 0; i < 3 * len; ++i) {
        const bool in_nan_row = i / len == 1;
        ASSERT_EQ(std::isnan(got[size_t(i)]), in_nan_row) << "element " << i;
      }
    }
  }
}

TEST(CudaSoftmax, IntegerTensorsRaise) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Tensor xi = zeros({2, 4}, {DType::i32, kGpu});
  EXPECT_EMBER_ERROR(native::softmax_stub.call(kGpu, "softmax")(xi, xi, geometry({2, 4}, 1), false), "softmax",
                     "floating-point", "int32");
}

TEST(CudaLayerNorm, IntegerTensorsRaise) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Tensor xi = zeros({2, 4}, {DType::i32, kGpu});
  EXPECT_EMBER_ERROR(native::layer_norm_stub.call(kGpu, "layer_norm")(xi, Tensor(), Tensor(), xi, Tensor(), Tensor(),
                                                                      2, 4, kEps),
                     "layer_norm", "floating-point");
}

TEST(CudaLayerNorm, ForwardMatchesReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  int variant = 0;
  for (const LayerNormCase& k : layer_norm_cases()) {
    for (DType dt : ember::testing::kFloatTypes) {
      const bool with_weight = variant % 2 == 0, with_bias = variant % 4 < 2;
      ++variant;
      SCOPED_TRACE(std::string("layer_norm ") + dtype_name(dt) + " " + shape_str(Shape{k.rows, k.cols}) +
                   (with_weight ? " weight" : "") + (with_bias ? " bias" : ""));
      const DType st = stats_dtype(dt);
      const Tensor x = random_tensor({k.rows, k.cols}, dt, false, -3.0, 5.0);
      const Tensor w = with_weight ? random_tensor({k.cols}, st) : Tensor();
      const Tensor b = with_bias ? random_tensor({k.cols}, st) : Tensor();
      const Tensor y = full({k.rows, k.cols}, kNaN, {dt, kGpu});
      const Tensor mean = full({k.rows}, kNaN, {st, kGpu});
      const Tensor rstd = full({k.rows}, kNaN, {st, kGpu});
      native::layer_norm_stub.call(kGpu, "layer_norm")(y, mean, rstd, x.to(kGpu), to_gpu_or_undefined(w),
                                                       to_gpu_or_undefined(b), k.rows, k.cols, kEps);
      const reference::RefTensor rx = reference::from_tensor(x);
      const reference::RefTensor rw = with_weight ? reference::from_tensor(w) : reference::RefTensor();
      const reference::RefTensor rb = with_bias ? reference::from_tensor(b) : reference::RefTensor();
      const reference::RefTensor want =
          reference::layer_norm(rx, 1, with_weight ? &rw : nullptr, with_bias ? &rb : nullptr, kEps);
      const double tol = tolerance(dt);
      EXPECT_TRUE(all_close(y, want, tol, tol));
      reference::RefTensor want_mean, want_rstd;
      reference_stats(rx, k.rows, k.cols, want_mean, want_rstd);
      const double stol = tolerance(st);
      EXPECT_TRUE(all_close(mean, want_mean, stol, stol)) << "mean";
      EXPECT_TRUE(all_close(rstd, want_rstd, stol, stol)) << "rstd";
    }
  }
}

TEST(CudaLayerNorm, BackwardMatchesReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  int variant = 0;
  for (const LayerNormCase& k : layer_norm_cases()) {
    for (DType dt : ember::testing::kFloatTypes) {
      // all three gradients; dx alone; dweight and dbias alone; dx and dbias without a weight
      const int which = variant++ % 4;
      const bool with_weight = which != 3;
      const bool want_dx = which != 2, want_dw = which == 0 || which == 2, want_db = which != 1;
      SCOPED_TRACE(std::string("layer_norm_backward ") + dtype_name(dt) + " " + shape_str(Shape{k.rows, k.cols}) +
                   " variant " + std::to_string(which));
      const DType st = stats_dtype(dt);
      const Tensor x = random_tensor({k.rows, k.cols}, dt, false, -3.0, 5.0);
      const Tensor g = random_tensor({k.rows, k.cols}, dt);
      const Tensor w = with_weight ? random_tensor({k.cols}, st) : Tensor();
      const reference::RefTensor rx = reference::from_tensor(x);
      reference::RefTensor rmean, rrstd;
      reference_stats(rx, k.rows, k.cols, rmean, rrstd);
      const Tensor dx = want_dx ? full({k.rows, k.cols}, kNaN, {dt, kGpu}) : Tensor();
      const Tensor dw = want_dw ? full({k.cols}, kNaN, {st, kGpu}) : Tensor();
      const Tensor db = want_db ? full({k.cols}, kNaN, {st, kGpu}) : Tensor();
      native::layer_norm_backward_stub.call(kGpu, "layer_norm_backward")(
          dx, dw, db, g.to(kGpu), x.to(kGpu), reference::to_tensor(rmean, st).to(kGpu),
          reference::to_tensor(rrstd, st).to(kGpu), to_gpu_or_undefined(w), k.rows, k.cols);
      const reference::RefTensor rw = with_weight ? reference::from_tensor(w) : reference::RefTensor();
      const reference::LayerNormGrads want =
          reference::layer_norm_backward(reference::from_tensor(g), rx, 1, with_weight ? &rw : nullptr, kEps);
      const double tol = tolerance(dt);
      // column sums over the rows: rounding grows with their count
      const double sum_atol = tol * std::sqrt(double(std::max<int64_t>(1, k.rows)));
      if (want_dx) {
        EXPECT_TRUE(all_close(dx, want.dx, tol, tol)) << "dx";
      }
      if (want_dw) {
        EXPECT_TRUE(all_close(dw, want.dweight, tol, sum_atol)) << "dweight";
      }
      if (want_db) {
        EXPECT_TRUE(all_close(db, want.dbias, tol, sum_atol)) << "dbias";
      }
    }
  }
}

TEST(CudaLayerNorm, NoRowsGiveZeroParameterGradients) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : ember::testing::kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const DType st = stats_dtype(dt);
    const Tensor dw = full({5}, kNaN, {st, kGpu});
    const Tensor db = full({5}, kNaN, {st, kGpu});
    const Tensor none = zeros({0, 5}, {dt, kGpu});
    const Tensor stats = zeros({0}, {st, kGpu});
    native::layer_norm_backward_stub.call(kGpu, "layer_norm_backward")(Tensor(), dw, db, none, none, stats, stats,
                                                                       Tensor(), 0, 5);
    EXPECT_TRUE(all_close(dw, zeros({5}, {st}), 0.0, 0.0));
    EXPECT_TRUE(all_close(db, zeros({5}, {st}), 0.0, 0.0));
  }
}

// dweight and dbias are summed over chunks of 128 rows (the chunks on grid.y, whose 65535 cap
// makes blocks take several), then chunk by chunk in order. Over many chunks they match the
// reference and repeat bit for bit; past the cap, a gradient that is one only on the first 128
// rows and the last 300 must be counted 428 times in every column.
TEST(CudaLayerNorm, ParameterGradientsOverManyRowChunks) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t rows = 5000, cols = 768;
    const DType st = stats_dtype(dt);
    const Tensor x = random_tensor({rows, cols}, dt, false, -3.0, 5.0), g = random_tensor({rows, cols}, dt);
    const reference::RefTensor rx = reference::from_tensor(x);
    reference::RefTensor rmean, rrstd;
    reference_stats(rx, rows, cols, rmean, rrstd);
    const Tensor mean = reference::to_tensor(rmean, st).to(kGpu), rstd = reference::to_tensor(rrstd, st).to(kGpu);
    const auto run = [&] {
      const Tensor dw = full({cols}, kNaN, {st, kGpu}), db = full({cols}, kNaN, {st, kGpu});
      native::layer_norm_backward_stub.call(kGpu, "layer_norm_backward")(Tensor(), dw, db, g.to(kGpu), x.to(kGpu),
                                                                         mean, rstd, Tensor(), rows, cols);
      return std::make_pair(dw, db);
    };
    const auto [dw, db] = run();
    const reference::LayerNormGrads want =
        reference::layer_norm_backward(reference::from_tensor(g), rx, 1, nullptr, kEps);
    const double tol = tolerance(dt), sum_atol = tol * std::sqrt(double(rows));
    EXPECT_TRUE(all_close(dw, want.dweight, tol, sum_atol)) << "dweight";
    EXPECT_TRUE(all_close(db, want.dbias, tol, sum_atol)) << "dbias";
    const auto again = run();
    EXPECT_EQ(dw.to_vector<double>(), again.first.to_vector<double>()) << "dweight differs on a second run";
    EXPECT_EQ(db.to_vector<double>(), again.second.to_vector<double>()) << "dbias differs on a second run";
  }
  // Every row is [0, 2]: mean 1, variance 1, xhat = [-r, r] with r = 1 / sqrt(1 + eps).
  const int64_t rows = 65535 * 128 + 300, cols = 2, tail = 300;
  const float r = float(1.0 / std::sqrt(1.0 + kEps));
  const Tensor x = zeros({rows, cols}, {DType::f32, kGpu});
  x.narrow(1, 1, 1).fill_(2.0);
  const Tensor g = zeros({rows, cols}, {DType::f32, kGpu});
  g.narrow(0, 0, 128).fill_(1.0);
  g.narrow(0, rows - tail, tail).fill_(1.0);
  const Tensor dw = full({cols}, kNaN, {DType::f32, kGpu}), db = full({cols}, kNaN, {DType::f32, kGpu});
  native::layer_norm_backward_stub.call(kGpu, "layer_norm_backward")(
      Tensor(), dw, db, g, x, full({rows}, 1.0, {DType::f32, kGpu}), full({rows}, r, {DType::f32, kGpu}), Tensor(),
      rows, cols);
  const double n = 128.0 + double(tail);
  EXPECT_EQ(db.to_vector<double>(), (std::vector<double>{n, n}));
  const std::vector<double> got = dw.to_vector<double>();
  EXPECT_NEAR(got[0], -n * r, 1e-3);
  EXPECT_NEAR(got[1], n * r, 1e-3);
}
