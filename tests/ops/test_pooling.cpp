// max_pool2d, avg_pool2d and adaptive_avg_pool2d: forward and backward against the reference
// over a table of kernels, strides, paddings, dilations and rounding modes, batched and
// unbatched, contiguous or not, in every floating dtype; tie and NaN routing of the max pool's
// gradient; output sizes; determinism across thread counts; gradcheck; error messages.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/native/pooling.h"
#include "kernels/reference/pooling.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::coin;
using ember::testing::expect_gradcheck;
using ember::testing::kFloatTypes;
using ember::testing::random_tensor;
using ember::testing::rng;
using ember::testing::tolerance;
using ember::testing::with_one_and_two_threads;
namespace ref = ember::reference;

namespace {

struct PoolCase {
  Shape input;
  ref::PoolOptions o;
};

// Kernel 2 and 3, stride 1 and 2 (and the default), padding, dilation, ceil mode, one-number
// and two-number options, batched and unbatched inputs.
std::vector<PoolCase> pool_cases() {
  return {
      {{2, 3, 8, 8}, {{2}, {}, {0}, {1}, false}},
      {{2, 3, 7, 9}, {{2}, {}, {0}, {1}, true}},
      {{2, 2, 6, 7}, {{3}, {1}, {1}, {1}, false}},
      {{1, 3, 7, 9}, {{3}, {2}, {1}, {1}, true}},
      {{3, 7, 6}, {{3, 2}, {2, 1}, {1, 0}, {1, 1}, false}},
      {{3, 5, 5}, {{2}, {2}, {1}, {1}, true}},
      {{2, 2, 7, 6}, {{2}, {1}, {0}, {2}, false}},
      {{1, 2, 9, 8}, {{3}, {2}, {1}, {2, 1}, true}},
      {{2, 1, 1, 1}, {{1}, {1}, {0}, {1}, false}},
      {{1, 1, 5, 5}, {{3}, {3}, {1}, {1}, true}},
      // 2x2 stride 2 in f32 takes a kernel of its own: full steps of 8 outputs, a partial last
      // step, and odd sizes whose last row and column no window reads.
      {{2, 3, 10, 38}, {{2}, {}, {0}, {1}, false}},
      {{1, 2, 9, 33}, {{2}, {2}, {0}, {1}, false}},
  };
}

std::string describe(const PoolCase& c, bool include_pad, DType dt, bool non_contiguous) {
  std::ostringstream s;
  s << "input " << shape_str(c.input) << " kernel " << shape_str(c.o.kernel_size) << " stride "
    << shape_str(c.o.stride) << " padding " << shape_str(c.o.padding) << " dilation " << shape_str(c.o.dilation)
    << (c.o.ceil_mode ? " ceil" : " floor")
    << (include_pad ? " count_include_pad" : "") << " " << dtype_name(dt) << (non_contiguous ? " strided" : "");
  return s.str();
}

Tensor max_pool(const Tensor& x, const ref::PoolOptions& o) {
  return max_pool2d(x, o.kernel_size, o.stride, o.padding, o.dilation, o.ceil_mode);
}
Tensor avg_pool(const Tensor& x, const ref::PoolOptions& o) {
  return avg_pool2d(x, o.kernel_size, o.stride, o.padding, o.ceil_mode, o.count_include_pad);
}

const std::vector<std::pair<Shape, Shape>> kAdaptiveCases = {
    {{2, 3, 7, 7}, {3}},       {{2, 5, 5}, {5, 5}},    {{1, 2, 1, 1}, {1}},
    {{2, 2, 8, 8}, {1, 1}},    {{3, 6, 7}, {4, 3}},    {{1, 1, 5, 9}, {2, 4}},
};

// Average pooling adds a window's values in a different order than the reference, and half
// types round the sum once more.
double avg_tol(DType dt) { return 2 * tolerance(dt); }

}  // namespace

TEST(MaxPool2d, ForwardMatchesReference) {
  for (const PoolCase& c : pool_cases()) {
    for (DType dt : kFloatTypes) {
      const bool nc = coin();
      SCOPED_TRACE(describe(c, false, dt, nc));
      Tensor x = random_tensor(c.input, dt, nc);
      Tensor y = max_pool(x, c.o);
      EXPECT_EQ(y.dtype(), dt);
      // the maximum is one of the inputs: exact in every dtype
      EXPECT_TRUE(all_close(y, ref::max_pool2d(ref::from_tensor(x), c.o), 0, 0));
    }
  }
}

TEST(MaxPool2d, BackwardMatchesReference) {
  for (const PoolCase& c : pool_cases()) {
    for (DType dt : kFloatTypes) {
      const bool nc = coin();
      SCOPED_TRACE(describe(c, false, dt, nc));
      Tensor x = random_tensor(c.input, dt, nc).requires_grad_();
      Tensor y = max_pool(x, c.o);
      Tensor g = random_tensor(y.shape(), dt, coin());
      y.backward(g);
      ASSERT_TRUE(x.grad().defined());
      EXPECT_EQ(x.grad().shape(), c.input);
      // the reference picks the argmax itself, so ties in half types land alike
      const ref::RefTensor want = ref::max_pool2d_backward(ref::from_tensor(x), ref::from_tensor(g), c.o);
      EXPECT_TRUE(all_close(x.grad(), want, tolerance(dt), tolerance(dt)));
    }
  }
}

TEST(MaxPool2d, TiesGoToTheFirstMaximumAndNaNWins) {
  // overlapping windows over equal values: each window's first element takes the gradient
  Tensor x = from_vector<double>({5, 5, 5, 5}, {1, 1, 4}).requires_grad_();
  Tensor y = max_pool2d(x, {1, 2}, {1, 1});
  y.backward(from_vector<double>({1, 10, 100}, {1, 1, 3}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{1, 10, 100, 0}));

  // a window with two NaNs: the result is NaN, and the gradient goes where PyTorch sends it,
  // the last NaN of the scan
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor xn = from_vector<double>({1, nan, nan, 3}, {1, 2, 2}).requires_grad_();
  Tensor yn = max_pool2d(xn, {2});
  EXPECT_TRUE(std::isnan(yn.to_vector<double>()[0]));
  yn.backward(ones_like(yn));
  EXPECT_EQ(xn.grad().to_vector<double>(), (std::vector<double>{0, 0, 1, 0}));
  const ref::PoolOptions k2{{2}, {}, {0}, {1}, false, true};
  EXPECT_TRUE(all_close(max_pool2d(xn.detach(), {2}), ref::max_pool2d(ref::from_tensor(xn.detach()), k2), 0, 0));

  // a window of -inf reports its first position inside the input, padding aside
  const double inf = std::numeric_limits<double>::infinity();
  Tensor xi = from_vector<double>({-inf, -inf}, {1, 1, 2}).requires_grad_();
  Tensor yi = max_pool2d(xi, {1, 3}, {1, 1}, {0, 1});
  EXPECT_EQ(yi.to_vector<double>(), (std::vector<double>{-inf, -inf}));
  yi.backward(ones_like(yi));
  EXPECT_EQ(xi.grad().to_vector<double>(), (std::vector<double>{2, 0}));
}

TEST(MaxPool2d, Float32TiesMatchReference) {
  // few distinct values, so most windows hold ties
  std::vector<float> v = random_tensor({2, 3, 9, 9}, DType::f32).to_vector<float>();
  for (float& e : v) e = std::round(e);
  Tensor xt = from_vector<float>(v, {2, 3, 9, 9}).requires_grad_();
  const ref::PoolOptions o{{3}, {1}, {1}, {1}, false};
  Tensor y = max_pool(xt, o);
  Tensor g = random_tensor(y.shape(), DType::f32);
  y.backward(g);
  EXPECT_TRUE(all_close(xt.grad(), ref::max_pool2d_backward(ref::from_tensor(xt), ref::from_tensor(g), o), 1e-6,
                        1e-6));
}

// The f32 2x2 stride-2 kernel under PyTorch's rules: ties go to the first maximum in row-major
// window order, any NaN wins (the last one when there are several), a window of -inf reports its
// first element; rows of 19 outputs cover its full and partial steps.
TEST(MaxPool2d, TwoByTwoKernelFollowsTheTieAndNaNRules) {
  std::vector<float> v = random_tensor({2, 3, 6, 38}, DType::f32).to_vector<float>();
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = std::round(v[i]);  // few distinct values: most windows hold ties
    if (i % 37 == 5 || i % 53 == 0) v[i] = nan;
    if (i % 29 == 3) v[i] = -inf;
  }
  for (size_t i : {0, 1, 38, 39}) v[i] = -inf;  // one window of -inf only
  Tensor x = from_vector<float>(v, {2, 3, 6, 38}).requires_grad_();
  const ref::PoolOptions o{{2}, {}, {0}, {1}, false};
  Tensor y = max_pool(x, o);
  EXPECT_TRUE(all_close(y, ref::max_pool2d(ref::from_tensor(x.detach()), o), 0, 0));
  Tensor g = random_tensor(y.shape(), DType::f32);
  y.backward(g);
  EXPECT_TRUE(all_close(x.grad(), ref::max_pool2d_backward(ref::from_tensor(x.detach()), ref::from_tensor(g), o), 0,
                        0));
}

// The f32 2x2 stride-2 backward writes each plane in one pass while every index lies in its own
// window; indices made by hand that name another window's element, or none, still sum as the
// general scatter does (plane 0 keeps the forward's kind of indices, plane 1 does not).
TEST(MaxPool2d, TwoByTwoBackwardTakesAnyIndices) {
  for (int64_t in_w : {10, 37}) {  // rows of 5 outputs (single steps), of 18 (full and overlapping ones)
    native::Pool2dGeometry g;
    g.planes = 2, g.in_h = 5, g.in_w = in_w, g.out_h = 2, g.out_w = in_w / 2;
    g.kernel_h = g.kernel_w = g.stride_h = g.stride_w = 2;
    const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
    std::vector<int64_t> ix(size_t(g.planes * out_plane));
    for (int64_t p = 0; p < g.planes; ++p)
      for (int64_t oh = 0; oh < g.out_h; ++oh)
        for (int64_t ow = 0; ow < g.out_w; ++ow)
          ix[size_t(p * out_plane + oh * g.out_w + ow)] = (2 * oh + (ow % 3 == 1)) * g.in_w + 2 * ow + (ow % 2);
    ix[size_t(out_plane + 3)] = ix[size_t(out_plane + 4)];  // two outputs name one element
    ix[size_t(out_plane + 5)] = -1;                        // names none
    ix[size_t(out_plane + 6)] = in_plane - 1;              // an element no window covers
    const Tensor go = random_tensor({g.planes, g.out_h, g.out_w}, DType::f32);
    const std::vector<float> gv = go.to_vector<float>();
    std::vector<float> want(size_t(g.planes * in_plane), 0.0f);
    for (int64_t p = 0; p < g.planes; ++p)
      for (int64_t o = 0; o < out_plane; ++o) {
        const int64_t i = ix[size_t(p * out_plane + o)];
        if (i >= 0 && i < in_plane) want[size_t(p * in_plane + i)] += gv[size_t(p * out_plane + o)];
      }
    const Tensor got = native::max_pool2d_backward(go, from_vector<int64_t>(ix, {g.planes, g.out_h, g.out_w}),
                                                   {g.planes, g.in_h, g.in_w}, g);
    EXPECT_EQ(got.to_vector<float>(), want) << "in_w " << in_w;
  }
}

TEST(AvgPool2d, ForwardAndBackwardMatchReference) {
  for (PoolCase c : pool_cases()) {
    c.o.dilation = {1};  // average pooling has no dilation
    for (bool include_pad : {true, false}) {
      c.o.count_include_pad = include_pad;
      for (DType dt : kFloatTypes) {
        const bool nc = coin();
        SCOPED_TRACE(describe(c, include_pad, dt, nc));
        Tensor x = random_tensor(c.input, dt, nc).requires_grad_();
        Tensor y = avg_pool(x, c.o);
        EXPECT_EQ(y.dtype(), dt);
        EXPECT_TRUE(all_close(y, ref::avg_pool2d(ref::from_tensor(x), c.o), avg_tol(dt), avg_tol(dt)));
        Tensor g = random_tensor(y.shape(), dt, coin());
        y.backward(g);
        EXPECT_TRUE(all_close(x.grad(), ref::avg_pool2d_backward(ref::from_tensor(x), ref::from_tensor(g), c.o),
                              avg_tol(dt), avg_tol(dt)));
      }
    }
  }
}

TEST(AvgPool2d, CountIncludePadChangesOnlyPaddedWindows) {
  Tensor x = ones({1, 1, 4, 4}, {DType::f64});
  // with the padding counted, a corner window of ones over 2 x 2 real cells averages 4 / 9
  const std::vector<double> with = avg_pool2d(x, {3}, {1}, {1}, false, true).to_vector<double>();
  const std::vector<double> without = avg_pool2d(x, {3}, {1}, {1}, false, false).to_vector<double>();
  EXPECT_DOUBLE_EQ(with[0], 4.0 / 9.0);
  EXPECT_DOUBLE_EQ(with[5], 1.0);  // an inner window
  for (double v : without) EXPECT_DOUBLE_EQ(v, 1.0);
}

TEST(AdaptiveAvgPool2d, ForwardAndBackwardMatchReference) {
  for (const auto& [shape, out] : kAdaptiveCases) {
    for (DType dt : kFloatTypes) {
      const bool nc = coin();
      SCOPED_TRACE(::testing::Message() << "input " << shape_str(shape) << " output " << shape_str(out) << " "
                                        << dtype_name(dt) << (nc ? " strided" : ""));
      Tensor x = random_tensor(shape, dt, nc).requires_grad_();
      Tensor y = adaptive_avg_pool2d(x, out);
      EXPECT_EQ(y.size(-2), out[0]);
      EXPECT_EQ(y.size(-1), out.size() == 1 ? out[0] : out[1]);
      EXPECT_TRUE(all_close(y, ref::adaptive_avg_pool2d(ref::from_tensor(x), out), avg_tol(dt), avg_tol(dt)));
      Tensor g = random_tensor(y.shape(), dt, coin());
      y.backward(g);
      EXPECT_TRUE(all_close(x.grad(), ref::adaptive_avg_pool2d_backward(ref::from_tensor(x), ref::from_tensor(g), out),
                            avg_tol(dt), avg_tol(dt)));
    }
  }
}

TEST(AdaptiveAvgPool2d, WholePlaneIsTheMean) {
  Tensor x = random_tensor({2, 3, 5, 4}, DType::f64);
  EXPECT_TRUE(all_close(adaptive_avg_pool2d(x, {1}), x.mean({-2, -1}, true), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(adaptive_avg_pool2d(x, {5, 4}), x, 0, 0));  // one cell per window
}

namespace {

// Runs `pool` forward, and backward from g, with 1 and 2 threads and expects want_y (its first
// element +0) and want_dx exactly from both; returns the one-thread output and gradient.
std::pair<Tensor, Tensor> expect_exact_pool(const std::function<Tensor(const Tensor&)>& pool, const Tensor& x,
                                            const Tensor& g, const std::vector<float>& want_y,
                                            const std::vector<float>& want_dx) {
  auto [y1, y2] = with_one_and_two_threads([&] { return pool(x); });
  auto [dx1, dx2] = with_one_and_two_threads([&] {
    Tensor xg = x.detach().requires_grad_();
    pool(xg).backward(g);
    return xg.grad();
  });
  for (const Tensor& y : {y1, y2}) {
    const std::vector<float> got = y.to_vector<float>();
    EXPECT_EQ(got, want_y);
    EXPECT_FALSE(std::signbit(got[0]));
  }
  for (const Tensor& dx : {dx1, dx2}) EXPECT_EQ(dx.to_vector<float>(), want_dx);
  return {y1, dx1};
}

}  // namespace

// The f32 2x2 stride-2 average pool (avg_pool2d 2x2, adaptive_avg_pool2d to half the size) has
// kernels of its own: rows of 3, 8 and 19 outputs (single outputs, full steps, an overlapping
// last step), odd sizes whose last row and column no window covers, 1 and 2 threads. Each output
// is the general kernel's ((x00 + x10) + (x01 + x11)) / 4, bit for bit, and each input's gradient
// grad_out / 4 or +0; the reference agrees to rounding.
TEST(AvgPool2d, TwoByTwoKernelMatchesTheGeneralOrder) {
  for (const Shape& shape : {Shape{3, 2, 6, 7}, Shape{2, 3, 4, 16}, Shape{2, 3, 9, 39}, Shape{1, 3, 10, 38}}) {
    const int64_t h = shape[2], w = shape[3], oh_n = h / 2, ow_n = w / 2, planes = shape[0] * shape[1];
    std::vector<float> v = random_tensor(shape, DType::f32).to_vector<float>();
    v[0] = v[1] = v[size_t(w)] = v[size_t(w) + 1] = -0.0f;  // the general kernel's sum of -0s is +0
    const Tensor x = from_vector<float>(v, shape);
    const Tensor g = random_tensor({shape[0], shape[1], oh_n, ow_n}, DType::f32);
    const std::vector<float> gv = g.to_vector<float>();
    std::vector<float> want_y(size_t(planes * oh_n * ow_n)), want_dx(v.size(), 0.0f);
    for (int64_t p = 0; p < planes; ++p)
      for (int64_t oh = 0; oh < oh_n; ++oh)
        for (int64_t ow = 0; ow < ow_n; ++ow) {
          const size_t at = size_t(p * h * w + 2 * oh * w + 2 * ow), o = size_t((p * oh_n + oh) * ow_n + ow);
          const float s = (0.0f + v[at] + v[at + size_t(w)]) + (v[at + 1] + v[at + size_t(w) + 1]);
          want_y[o] = s / 4.0f;
          for (size_t d : {size_t(0), size_t(1), size_t(w), size_t(w) + 1}) want_dx[at + d] = 0.0f + gv[o] / 4.0f;
        }
    for (bool adaptive : {false, true}) {
      if (adaptive && (h % 2 || w % 2)) continue;  // adaptive windows are 2x2 only at twice the size
      SCOPED_TRACE(::testing::Message() << "input " << shape_str(shape) << (adaptive ? " adaptive" : " avg_pool2d"));
      auto pool = [&](const Tensor& in) {
        return adaptive ? adaptive_avg_pool2d(in, {oh_n, ow_n}) : avg_pool2d(in, {2});
      };
      const auto [y1, dx1] = expect_exact_pool(pool, x, g, want_y, want_dx);
      const ref::PoolOptions o{{2}, {}, {0}, {1}, false};
      EXPECT_TRUE(all_close(y1, ref::avg_pool2d(ref::from_tensor(x), o), 1e-6, 1e-6));
      EXPECT_TRUE(all_close(dx1, ref::avg_pool2d_backward(ref::from_tensor(x), ref::from_tensor(g), o), 0, 0));
    }
  }
}

// The f32 global average pool (adaptive_avg_pool2d to 1x1, avg_pool2d over the whole plane) has
// kernels of its own: 7x7 planes (rows read eight floats at a time, but not past the end of x),
// rows of 13 (a full and a partial vector), single elements, 1 and 2 threads. Each output is the
// general kernel's column sums down the rows from zero, added left to right from zero, over the
// plane's size, bit for bit; each input's gradient is 0 + grad_out / size.
TEST(AdaptiveAvgPool2d, GlobalKernelMatchesTheGeneralOrder) {
  for (const Shape& shape : {Shape{3, 5, 7, 7}, Shape{2, 3, 4, 13}, Shape{2, 1, 1, 1}}) {
    const int64_t h = shape[2], w = shape[3], planes = shape[0] * shape[1];
    std::vector<float> v = random_tensor(shape, DType::f32).to_vector<float>();
    std::fill(v.begin(), v.begin() + h * w, -0.0f);  // a plane of -0s averages +0
    const Tensor x = from_vector<float>(v, shape);
    const Tensor g = random_tensor({shape[0], shape[1], 1, 1}, DType::f32);
    const std::vector<float> gv = g.to_vector<float>();
    std::vector<float> want_y(static_cast<size_t>(planes)), want_dx(v.size());
    for (int64_t p = 0; p < planes; ++p) {
      float s = 0.0f;
      for (int64_t iw = 0; iw < w; ++iw) {
        float column = 0.0f;
        for (int64_t ih = 0; ih < h; ++ih) column += v[size_t(p * h * w + ih * w + iw)];
        s += column;
      }
      want_y[size_t(p)] = s / float(h * w);
      std::fill(want_dx.begin() + p * h * w, want_dx.begin() + (p + 1) * h * w, 0.0f + gv[size_t(p)] / float(h * w));
    }
    for (bool adaptive : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "input " << shape_str(shape) << (adaptive ? " adaptive" : " avg_pool2d"));
      auto pool = [&](const Tensor& in) { return adaptive ? adaptive_avg_pool2d(in, {1}) : avg_pool2d(in, {h, w}); };
      const auto [y1, dx1] = expect_exact_pool(pool, x, g, want_y, want_dx);
      EXPECT_TRUE(all_close(y1, ref::adaptive_avg_pool2d(ref::from_tensor(x), {1}), 1e-6, 1e-6));
      EXPECT_TRUE(all_close(dx1, ref::adaptive_avg_pool2d_backward(ref::from_tensor(x), ref::from_tensor(g), {1}), 1e-7,
                            1e-7));
    }
  }
}

TEST(Pool2d, OutputSizesFollowTorchRounding) {
  auto size_of = [](const Tensor& t) { return Shape{t.size(-2), t.size(-1)}; };
  Tensor x5 = zeros({1, 1, 5, 5});
  EXPECT_EQ(size_of(max_pool2d(x5, {2})), (Shape{2, 2}));
  EXPECT_EQ(size_of(max_pool2d(x5, {2}, {}, {0}, {1}, true)), (Shape{3, 3}));
  // ceil mode drops a last window that would start in the right padding: 6 / 3 + 1 = 3 -> 2
  EXPECT_EQ(size_of(max_pool2d(x5, {3}, {3}, {1}, {1}, true)), (Shape{2, 2}));
  EXPECT_EQ(size_of(avg_pool2d(x5, {3}, {3}, {1}, true)), (Shape{2, 2}));
  EXPECT_EQ(size_of(max_pool2d(x5, {3}, {1}, {0}, {2})), (Shape{1, 1}));
  EXPECT_EQ(size_of(avg_pool2d(zeros({3, 4, 4}), {2}, {1}, {1})), (Shape{5, 5}));
  EXPECT_EQ(max_pool2d(zeros({0, 2, 4, 4}), {2}).shape(), (Shape{0, 2, 2, 2}));
  EXPECT_EQ(adaptive_avg_pool2d(zeros({0, 2, 4, 4}), {3}).shape(), (Shape{0, 2, 3, 3}));
}

TEST(Pool2d, SameResultWithOneAndTwoThreads) {
  Tensor x = random_tensor({4, 8, 12, 12}, DType::f32);
  auto [a, b] = with_one_and_two_threads([&] { return max_pool2d(x, {3}, {2}, {1}); });
  EXPECT_TRUE(all_close(a, b, 0, 0));
  auto [c, d] = with_one_and_two_threads([&] { return avg_pool2d(x, {3}, {2}, {1}); });
  EXPECT_TRUE(all_close(c, d, 0, 0));
}

TEST(Pool2d, Gradcheck) {
  // distinct values 0.1 apart, so no maximum moves under the finite differences
  auto distinct = [](const Shape& shape) {
    std::vector<double> v(size_t(numel_of(shape)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1 * double(i);
    std::shuffle(v.begin(), v.end(), rng());
    return from_vector<double>(v, shape).requires_grad_();
  };
  for (const PoolCase& c : pool_cases()) {
    if (numel_of(c.input) > 200) continue;
    SCOPED_TRACE(describe(c, true, DType::f64, false));
    expect_gradcheck([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{max_pool(in[0], c.o)}; },
                     {distinct(c.input)});
    ref::PoolOptions a = c.o;
    a.dilation = {1};
    for (bool include_pad : {true, false}) {
      a.count_include_pad = include_pad;
      expect_gradcheck([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{avg_pool(in[0], a)}; },
                       {random_tensor(c.input, DType::f64, coin()).requires_grad_()});
    }
  }
  for (const auto& [shape, out] : kAdaptiveCases)
    expect_gradcheck(
        [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{adaptive_avg_pool2d(in[0], out)}; },
        {random_tensor(shape, DType::f64, coin()).requires_grad_()});
}

TEST(Pool2d, Errors) {
  Tensor x = zeros({1, 2, 4, 4});
  EXPECT_EMBER_ERROR(max_pool2d(zeros({4, 4}), {2}), "max_pool2d", "3-D", "4-D", "[4, 4]");
  EXPECT_EMBER_ERROR(avg_pool2d(zeros({1, 1, 1, 4, 4}), {2}), "avg_pool2d", "[1, 1, 1, 4, 4]");
  EXPECT_EMBER_ERROR(max_pool2d(zeros({1, 2, 4, 4}, {DType::i64}), {2}), "max_pool2d", "floating-point", "int64");
  EXPECT_EMBER_ERROR(max_pool2d(zeros({1, 0, 4, 4}), {2}), "max_pool2d", "empty dim 1", "[1, 0, 4, 4]");
  EXPECT_EMBER_ERROR(max_pool2d(x, {0, 2}), "max_pool2d", "kernel_size must be positive", "[0, 2]", "[1, 2, 4, 4]");
  EXPECT_EMBER_ERROR(max_pool2d(x, {2, 2, 2}), "max_pool2d", "kernel_size", "1 or 2 values", "[2, 2, 2]");
  EXPECT_EMBER_ERROR(max_pool2d(x, {2}, {0}), "max_pool2d", "stride must be positive", "[0, 0]");
  EXPECT_EMBER_ERROR(max_pool2d(x, {2}, {}, {0}, {0, 1}), "max_pool2d", "dilation must be positive", "[0, 1]");
  EXPECT_EMBER_ERROR(max_pool2d(x, {2}, {}, {2}), "max_pool2d", "padding [2, 2]", "at most half", "[2, 2]");
  EXPECT_EMBER_ERROR(avg_pool2d(x, {3}, {}, {-1}), "avg_pool2d", "padding [-1, -1]", "non-negative");
  EXPECT_EMBER_ERROR(max_pool2d(x, {5}), "max_pool2d", "too small", "[1, 2, 4, 4]", "kernel_size [5, 5]");
  EXPECT_EMBER_ERROR(max_pool2d(x, {3}, {1}, {0}, {2}), "max_pool2d", "too small", "dilation [2, 2]");
  EXPECT_EMBER_ERROR(adaptive_avg_pool2d(x, {0, 2}), "adaptive_avg_pool2d", "output_size must be positive", "[0, 2]");
  EXPECT_EMBER_ERROR(adaptive_avg_pool2d(x, {}), "adaptive_avg_pool2d", "output_size", "1 or 2 values");
  EXPECT_EMBER_ERROR(adaptive_avg_pool2d(zeros({5}), {1}), "adaptive_avg_pool2d", "[5]");
}
