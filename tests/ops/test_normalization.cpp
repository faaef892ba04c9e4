// softmax, log_softmax and layer_norm: forward and the dedicated backward kernels against
// the double reference over random shapes, every dim, layouts and dtypes; gradcheck in f64;
// numerical stability; errors that name the op and the shapes.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "kernels/reference/normalization.h"
#include "same_bits.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::coin;
using ember::testing::expect_rows_alone_as_among_others;
using ember::testing::for_each_odd_row_count_case;
using ember::testing::kFloatTypes;
using ember::testing::random_shape;
using ember::testing::random_tensor;
using ember::testing::same_bits;
using ember::testing::tolerance;
using ember::testing::uniform_int;
using ember::testing::with_one_and_two_threads;
using reference::RefTensor;

namespace {

std::string describe(const Shape& shape, int64_t dim, bool non_contiguous, DType dt) {
  return "shape " + shape_str(shape) + " dim " + std::to_string(dim) +
         (non_contiguous ? " non-contiguous " : " contiguous ") + dtype_name(dt);
}

// Gradient of sum(out * g) with respect to x, through autograd.
Tensor grad_through(const std::function<Tensor(const Tensor&)>& f, const Tensor& x_in, const Tensor& g) {
  Tensor x = x_in.detach().requires_grad_();
  f(x).backward(g);
  return x.grad();
}

// Low-precision backward results are compared with a looser tolerance: the gradient formula
// subtracts nearly equal terms, so rounding of the inputs shows up in absolute terms.
double grad_tolerance(DType dt) { return dt == DType::f64 ? 1e-9 : dt == DType::f32 ? 2e-5 : 4 * tolerance(dt); }

}  // namespace

TEST(Softmax, ForwardMatchesReferenceOnEveryDim) {
  for (DType dt : kFloatTypes) {
    for (int trial = 0; trial < 40; ++trial) {
      const int ndim = uniform_int(0, 4);
      const Shape shape = random_shape(ndim, 6, trial % 6 == 0);
      const bool non_contiguous = coin();
      const int64_t dim = ndim == 0 ? uniform_int(-1, 0) : uniform_int(-ndim, ndim - 1);
      SCOPED_TRACE(describe(shape, dim, non_contiguous, dt));
      Tensor x = random_tensor(shape, dt, non_contiguous, -4.0, 4.0);
      const RefTensor rx = reference::from_tensor(x);
      const double tol = tolerance(dt);
      Tensor y = softmax(x, dim);
      EXPECT_EQ(y.dtype(), dt);
      EXPECT_TRUE(all_close(y, reference::softmax(rx, dim), tol, tol * 1e-2)) << "softmax";
      Tensor ly = log_softmax(x, dim);
      EXPECT_EQ(ly.dtype(), dt);
      EXPECT_TRUE(all_close(ly, reference::log_softmax(rx, dim), tol, tol)) << "log_softmax";
    }
  }
}

TEST(Softmax, LongRowsAndColumnsMatchReference) {
  // long last dim (attention scores), a long middle dim (column kernel), size-1 dims
  const std::vector<std::pair<Shape, int64_t>> cases = {
      {{4, 3000}, -1}, {{2, 3000, 3}, 1}, {{3, 70, 130}, 1}, {{130, 5}, 0}, {{5, 1}, 1}, {{1, 5}, 0}, {{7}, 0},
  };
  for (DType dt : kFloatTypes) {
    for (const auto& [shape, dim] : cases) {
      SCOPED_TRACE(describe(shape, dim, false, dt));
      Tensor x = random_tensor(shape, dt, false, -10.0, 10.0);
      const RefTensor rx = reference::from_tensor(x);
      const double tol = tolerance(dt);
      EXPECT_TRUE(all_close(softmax(x, dim), reference::softmax(rx, dim), tol, tol * 1e-2));
      EXPECT_TRUE(all_close(log_softmax(x, dim), reference::log_softmax(rx, dim), tol, tol));
      EXPECT_TRUE(all_close(x.softmax(dim), reference::softmax(rx, dim), tol, tol * 1e-2));
      EXPECT_TRUE(all_close(x.log_softmax(dim), reference::log_softmax(rx, dim), tol, tol));
    }
  }
}

TEST(Softmax, IsStableForLargeInputsAndMaskedEntries) {
  const float inf = std::numeric_limits<float>::infinity();
  Tensor x = from_vector<float>({1000, 1001, 1002, -1000, -inf, 0}, {2, 3});
  const RefTensor rx = reference::from_tensor(x);
  Tensor y = softmax(x, 1);
  EXPECT_TRUE(all_close(y, reference::softmax(rx, 1), 1e-6, 1e-7));
  EXPECT_EQ(y.to_vector<float>()[4], 0.0f);  // a masked (-inf) score gets exactly zero weight
  Tensor ly = log_softmax(x, 1);
  EXPECT_TRUE(all_close(ly, reference::log_softmax(rx, 1), 1e-6, 1e-6));
  EXPECT_EQ(ly.to_vector<float>()[4], -inf);
  // the same along a non-last dim (column kernel)
  Tensor yt = softmax(x.t().contiguous(), 0);
  EXPECT_TRUE(all_close(yt, reference::softmax(reference::from_tensor(x.t().contiguous()), 0), 1e-6, 1e-7));
  // very negative scores, as with an additive attention mask, underflow to zero
  Tensor m = from_vector<float>({0, -1e9f, 3, -1e4f});
  EXPECT_TRUE(all_close(softmax(m, 0), reference::softmax(reference::from_tensor(m), 0), 1e-6, 1e-30));
  // NaN anywhere in a row makes that row NaN
  Tensor n = from_vector<float>({1, NAN, 2, 3, 4, 5}, {2, 3});
  auto sn = softmax(n, 1).to_vector<float>();
  EXPECT_TRUE(std::isnan(sn[0]) && std::isnan(sn[2]));
  EXPECT_FALSE(std::isnan(sn[3]));
}

TEST(Softmax, ARowGivesTheSameBitsAloneOrAmongOthers) {
  // the kernel takes rows two at a time; an odd row count leaves one alone, and how rows pair
  // depends on where a thread's share starts, so each row must come out the same either way
  for_each_odd_row_count_case([](const Tensor& x) {
    const Tensor y = softmax(x, -1);
    for (int64_t r = 0; r < x.shape()[0]; ++r)
      EXPECT_TRUE(same_bits(y.narrow(0, r, 1), softmax(x.narrow(0, r, 1).contiguous(), -1))) << "row " << r;
  });
}

TEST(Softmax, RowsSumToOne) {
  Tensor x = random_tensor({64, 777}, DType::f32, false, -20.0, 20.0);
  Tensor s = softmax(x, -1).sum({1});
  EXPECT_TRUE(all_close(s, full({64}, 1.0), 1e-6, 0));
  Tensor ls = log_softmax(x, -1).exp().sum({1});
  EXPECT_TRUE(all_close(ls, full({64}, 1.0), 1e-5, 0));
}

TEST(Softmax, BackwardKernelsMatchReference) {
  for (DType dt : kFloatTypes) {
    for (int trial = 0; trial < 25; ++trial) {
      const int ndim = uniform_int(1, 4);
      const Shape shape = random_shape(ndim, 6);
      const int64_t dim = uniform_int(-ndim, ndim - 1);
      const bool non_contiguous = coin();
      SCOPED_TRACE(describe(shape, dim, non_contiguous, dt));
      Tensor x = random_tensor(shape, dt, non_contiguous, -3.0, 3.0);
      Tensor g = random_tensor(shape, dt, coin());
      const RefTensor rg = reference::from_tensor(g);
      const double tol = grad_tolerance(dt);
      // the reference backward is evaluated at the (rounded) forward output ember saved
      Tensor y = softmax(x, dim);
      EXPECT_TRUE(all_close(grad_through([&](const Tensor& t) { return softmax(t, dim); }, x, g),
                            reference::softmax_backward(rg, reference::from_tensor(y), dim), tol, tol))
          << "softmax backward";
      Tensor ly = log_softmax(x, dim);
      EXPECT_TRUE(all_close(grad_through([&](const Tensor& t) { return log_softmax(t, dim); }, x, g),
                            reference::log_softmax_backward(rg, reference::from_tensor(ly), dim), tol, tol))
          << "log_softmax backward";
    }
  }
}

TEST(Softmax, Gradcheck) {
  for (int trial = 0; trial < 6; ++trial) {
    const int ndim = uniform_int(1, 3);
    const Shape shape = random_shape(ndim, 4);
    Tensor x = random_tensor(shape, DType::f64, coin()).requires_grad_();
    for (int64_t dim = -ndim; dim < ndim; ++dim) {
      SCOPED_TRACE(describe(shape, dim, !x.is_contiguous(), DType::f64));
      auto r = gradcheck([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{softmax(in[0], dim)}; }, {x});
      EXPECT_TRUE(r.ok) << "softmax: " << r.message;
      auto lr =
          gradcheck([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{log_softmax(in[0], dim)}; }, {x});
      EXPECT_TRUE(lr.ok) << "log_softmax: " << lr.message;
    }
  }
}

TEST(Softmax, Errors) {
  Tensor x = zeros({2, 3});
  EXPECT_EMBER_ERROR(softmax(x, 2), "softmax", "dim 2", "[2, 3]");
  EXPECT_EMBER_ERROR(log_softmax(x, -3), "log_softmax", "dim -3", "[2, 3]");
  EXPECT_EMBER_ERROR(softmax(zeros({2, 3}, {DType::i64}), 1), "softmax", "int64");
  EXPECT_EQ(softmax(zeros({0, 3}), 1).shape(), (Shape{0, 3}));
  EXPECT_EQ(softmax(zeros({3, 0}), 1).shape(), (Shape{3, 0}));
  EXPECT_EQ(softmax(scalar_tensor(5.0), 0).item<float>(), 1.0f);
  EXPECT_EQ(log_softmax(scalar_tensor(5.0), -1).item<float>(), 0.0f);
}

// ---- layer norm

namespace {

struct LayerNormCase {
  Shape shape;
  int64_t normalized_ndim;
  bool weight, bias;
};

Shape trailing(const Shape& shape, int64_t k) { return Shape(shape.end() - k, shape.end()); }

// Worst row of max|x| / sqrt(var + eps) over the trailing `k` dims: the kernel's `x - mean`
// loses about an ulp of max|x|, and normalising divides that error by the row's deviation,
// so a row of nearly equal values (two elements 1e-3 apart) is ill-conditioned in any precision.
double layer_norm_conditioning(const RefTensor& x, int64_t k, double eps) {
  const Shape ns = trailing(x.shape, k);
  const size_t row = size_t(numel_of(ns));
  double worst = 1.0;
  for (size_t start = 0; row > 0 && start < x.data.size(); start += row) {
    double mean = 0, peak = 0;
    for (size_t i = 0; i < row; ++i) mean += x.data[start + i], peak = std::max(peak, std::abs(x.data[start + i]));
    mean /= double(row);
    double var = 0;
    for (size_t i = 0; i < row; ++i) var += (x.data[start + i] - mean) * (x.data[start + i] - mean);
    worst = std::max(worst, peak / std::sqrt(var / double(row) + eps));
  }
  return worst;
}

}  // namespace

TEST(LayerNorm, ForwardMatchesReference) {
  for (DType dt : kFloatTypes) {
    for (int trial = 0; trial < 30; ++trial) {
      const int ndim = uniform_int(1, 4);
      const int64_t k = uniform_int(1, std::min(ndim, 2));
      const Shape shape = random_shape(ndim, 7, trial % 10 == 0);
      const Shape ns = trailing(shape, k);
      const bool with_w = coin(), with_b = coin(), non_contiguous = coin();
      SCOPED_TRACE("shape " + shape_str(shape) + " normalized " + shape_str(ns) + (with_w ? " weight" : "") +
                   (with_b ? " bias" : "") + (non_contiguous ? " non-contiguous " : " ") + dtype_name(dt));
      Tensor x = random_tensor(shape, dt, non_contiguous, -3.0, 3.0);
      Tensor w = with_w ? random_tensor(ns, dt) : Tensor();
      Tensor b = with_b ? random_tensor(ns, dt) : Tensor();
      const RefTensor rx = reference::from_tensor(x);
      const RefTensor rw = with_w ? reference::from_tensor(w) : RefTensor();
      const RefTensor rb = with_b ? reference::from_tensor(b) : RefTensor();
      const double eps = coin() ? 1e-5 : 1e-12;
      Tensor y = layer_norm(x, ns, w, b, eps);
      EXPECT_EQ(y.dtype(), dt);
      const double tol = tolerance(dt);
      // well-conditioned rows (the common case) keep the plain 4*tol; only a row whose
      // values nearly coincide loosens its trial, by its conditioning over 100
      const double atol = 4 * tol * std::max(1.0, layer_norm_conditioning(rx, k, eps) / 100);
      EXPECT_TRUE(all_close(y, reference::layer_norm(rx, k, with_w ? &rw : nullptr, with_b ? &rb : nullptr, eps),
                            tol, atol));
    }
  }
}

TEST(LayerNorm, LargeOffsetsAndConstantRows) {
  // a mean far from zero must not cancel the variance away
  Tensor x = random_tensor({8, 768}, DType::f32) + 1000.0;
  const RefTensor rx = reference::from_tensor(x);
  EXPECT_TRUE(all_close(layer_norm(x, {768}), reference::layer_norm(rx, 1, nullptr, nullptr, 1e-5), 1e-4, 1e-4));
  // a constant row normalises to zero (variance 0, eps keeps rstd finite)
  Tensor c = full({2, 5}, 3.0);
  EXPECT_TRUE(all_close(layer_norm(c, {5}), zeros({2, 5}), 0, 0));
}

TEST(LayerNorm, ARowGivesTheSameBitsAloneOrAmongOthers) {
  // the forward kernel takes rows two at a time (see Softmax's test of the same name), and a
  // backward that did must keep each row's dx and the row order of the dweight / dbias sums;
  // rows 4 on hold no NaN, so their dweight is not NaN throughout
  for_each_odd_row_count_case([](const Tensor& x) {
    const auto forward = [](const Tensor& xs, int64_t, const Tensor& w, const Tensor& b) {
      return layer_norm(xs, {xs.shape()[1]}, w, b);
    };
    expect_rows_alone_as_among_others(x, forward);
    expect_rows_alone_as_among_others(x.narrow(0, 4, 5).contiguous(), forward);
  });
}

TEST(LayerNorm, SameResultsWhateverTheThreadCount) {
  // an odd row count, so the two threads' shares start a row pair at different rows than one
  // thread does; weight and bias both, whose product and sum must round alike in every copy of
  // the kernel's loop; a row length with a tail past the 8-lane blocks
  const Tensor x = random_tensor({97, 261}), w = random_tensor({261}), b = random_tensor({261});
  const Tensor g = random_tensor({97, 261});
  auto run = [&] {
    Tensor xl = x.detach().requires_grad_(), wl = w.detach().requires_grad_(), bl = b.detach().requires_grad_();
    Tensor y = layer_norm(xl, {261}, wl, bl);
    y.backward(g);
    return cat({y.detach().reshape({-1}), xl.grad().reshape({-1}), wl.grad(), bl.grad()});
  };
  auto [one, two] = with_one_and_two_threads(run);
  EXPECT_TRUE(same_bits(one, two));
}

TEST(LayerNorm, BackwardKernelMatchesReference) {
  // more than one chunk of rows, so the dweight/dbias partial sums are combined
  const std::vector<LayerNormCase> cases = {
      {{100, 33}, 1, true, true}, {{3, 4, 5}, 2, true, false}, {{7, 6}, 1, false, true},
      {{2, 3, 8}, 1, false, false}, {{1, 1}, 1, true, true},   {{70, 2, 3}, 2, true, true},
  };
  for (DType dt : kFloatTypes) {
    for (const LayerNormCase& c : cases) {
      const Shape ns = trailing(c.shape, c.normalized_ndim);
      SCOPED_TRACE("shape " + shape_str(c.shape) + " normalized " + shape_str(ns) + (c.weight ? " weight" : "") +
                   (c.bias ? " bias " : " ") + dtype_name(dt));
      Tensor x = random_tensor(c.shape, dt, coin()).requires_grad_();
      Tensor w = c.weight ? random_tensor(ns, dt).requires_grad_() : Tensor();
      Tensor b = c.bias ? random_tensor(ns, dt).requires_grad_() : Tensor();
      Tensor g = random_tensor(c.shape, dt);
      layer_norm(x, ns, w, b, 1e-5).backward(g);
      const RefTensor rw = c.weight ? reference::from_tensor(w) : RefTensor();
      auto ref = reference::layer_norm_backward(reference::from_tensor(g), reference::from_tensor(x),
                                                c.normalized_ndim, c.weight ? &rw : nullptr, 1e-5);
      // dx is a difference of terms of size |g w| rstd; the sums over rows scale with the row count
      const double tol = grad_tolerance(dt);
      EXPECT_TRUE(all_close(x.grad(), ref.dx, tol, 4 * tol)) << "dx";
      const double rows = double(numel_of(c.shape) / numel_of(ns));
      if (c.weight) {
        EXPECT_EQ(w.grad().dtype(), dt);
        EXPECT_TRUE(all_close(w.grad(), ref.dweight, tol, tol * std::sqrt(rows))) << "dweight";
      }
      if (c.bias) {
        EXPECT_TRUE(all_close(b.grad(), ref.dbias, tol, tol * std::sqrt(rows))) << "dbias";
      }
    }
  }
}

TEST(LayerNorm, MixedPrecisionWeightsKeepTheirDtype) {
  Tensor x = random_tensor({4, 16}, DType::bf16).requires_grad_();
  Tensor w = random_tensor({16}, DType::f32).requires_grad_();
  Tensor b = random_tensor({16}, DType::f32).requires_grad_();
  Tensor y = layer_norm(x, {16}, w, b);
  EXPECT_EQ(y.dtype(), DType::bf16);
  const RefTensor rw = reference::from_tensor(w), rb = reference::from_tensor(b);
  EXPECT_TRUE(all_close(y, reference::layer_norm(reference::from_tensor(x), 1, &rw, &rb, 1e-5), 1.6e-2, 3e-2));
  y.sum().backward();
  EXPECT_EQ(x.grad().dtype(), DType::bf16);
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_EQ(b.grad().dtype(), DType::f32);
  EXPECT_TRUE(all_close(b.grad(), full({16}, 4.0), 0, 0));
}

TEST(LayerNorm, Gradcheck) {
  const std::vector<LayerNormCase> cases = {
      {{3, 5}, 1, true, true},  {{3, 5}, 1, false, false}, {{2, 3, 4}, 2, true, true},
      {{2, 3, 4}, 2, true, false}, {{4, 3}, 1, false, true}, {{6}, 1, true, true},
  };
  for (const LayerNormCase& c : cases) {
    const Shape ns = trailing(c.shape, c.normalized_ndim);
    SCOPED_TRACE("shape " + shape_str(c.shape) + " normalized " + shape_str(ns) + (c.weight ? " weight" : "") +
                 (c.bias ? " bias" : ""));
    std::vector<Tensor> inputs = {random_tensor(c.shape, DType::f64).requires_grad_(),
                                  c.weight ? random_tensor(ns, DType::f64).requires_grad_() : Tensor(),
                                  c.bias ? random_tensor(ns, DType::f64).requires_grad_() : Tensor()};
    auto r = gradcheck(
        [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{layer_norm(in[0], ns, in[1], in[2], 1e-5)}; },
        inputs);
    EXPECT_TRUE(r.ok) << r.message;
  }
}

TEST(LayerNorm, OnlyRequestedGradientsAreComputed) {
  Tensor x = random_tensor({3, 4}, DType::f64);
  Tensor w = random_tensor({4}, DType::f64).requires_grad_();
  Tensor b = random_tensor({4}, DType::f64);
  layer_norm(x, {4}, w, b).sum().backward();
  EXPECT_TRUE(w.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  EXPECT_FALSE(x.grad().defined());
  // with no input needing grad no graph is recorded
  EXPECT_FALSE(layer_norm(x, {4}, b, b).requires_grad());
}

TEST(LayerNorm, Errors) {
  Tensor x = zeros({2, 3, 4});
  EXPECT_EMBER_ERROR(layer_norm(x, {3}), "layer_norm", "normalized_shape [3]", "[2, 3, 4]");
  EXPECT_EMBER_ERROR(layer_norm(x, {4, 3}), "layer_norm", "[4, 3]", "[2, 3, 4]");
  EXPECT_EMBER_ERROR(layer_norm(x, {1, 2, 3, 4}), "layer_norm", "[1, 2, 3, 4]", "[2, 3, 4]");
  EXPECT_EMBER_ERROR(layer_norm(x, {}), "layer_norm", "[2, 3, 4]");
  EXPECT_EMBER_ERROR(layer_norm(x, {4}, zeros({3})), "layer_norm", "weight", "[3]", "[4]");
  EXPECT_EMBER_ERROR(layer_norm(x, {3, 4}, ones({4})), "layer_norm", "weight", "[4]", "[3, 4]");
  EXPECT_EMBER_ERROR(layer_norm(x, {4}, ones({4}), zeros({4, 1})), "layer_norm", "bias", "[4, 1]", "[4]");
  EXPECT_EMBER_ERROR(layer_norm(zeros({2, 4}, {DType::i32}), {4}), "layer_norm", "int32");
  EXPECT_EQ(layer_norm(zeros({0, 4}), {4}, ones({4}), zeros({4})).shape(), (Shape{0, 4}));
}
