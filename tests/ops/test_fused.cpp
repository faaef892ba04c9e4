// Fused ops (bias_gelu, add_layer_norm, scaled_masked_softmax, packed_self_attention): forward
// and backward against the double reference and against the unfused composition they stand for
// (dropout masks included), in every float dtype they take and mixed bf16/f32 inputs; gradcheck
// in f64; the autocast policy; thread-count independence; AVX-512 and AVX2 kernels agreeing;
// errors that name the op and the shapes. Also the dropout mask stream on every kernel path.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/cpu_features.h"
#include "core/native/fused.h"
#include "kernels/cpu/dropout_mask.h"
#include "kernels/reference/fused.h"
#include "kernels/reference/nn_functional.h"
#include "same_bits.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::coin;
using ember::testing::expect_gradcheck;
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

std::string describe(const std::string& op, const Shape& shape, DType dt, const std::string& extra = "") {
  return op + " shape " + shape_str(shape) + " " + dtype_name(dt) + (extra.empty() ? "" : " " + extra);
}

// Gradients of sum(f(inputs) * g) with respect to each input, through autograd.
std::vector<Tensor> grads_through(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                  const std::vector<Tensor>& inputs, const Tensor& g) {
  std::vector<Tensor> leaves;
  for (const Tensor& t : inputs) leaves.push_back(t.defined() ? t.detach().requires_grad_() : t);
  f(leaves).backward(g);
  std::vector<Tensor> out;
  for (const Tensor& t : leaves) out.push_back(t.defined() ? t.grad() : Tensor());
  return out;
}

// Backward results subtract nearly equal terms; half-precision inputs show in absolute terms.
double grad_tolerance(DType dt) { return dt == DType::f64 ? 1e-9 : dt == DType::f32 ? 2e-5 : 4 * tolerance(dt); }

// A row-length dim that exercises the 8-lane bodies and their tails.
int64_t random_cols() {
  const int64_t choices[] = {1, 3, 8, 13, 16, 33, 64, 100};
  return choices[uniform_int(0, 7)];
}

RefTensor ref(const Tensor& t) { return reference::from_tensor(t); }

}  // namespace

// ---------------------------------------------------------------- bias_gelu

TEST(BiasGelu, ForwardAndBackwardMatchReference) {
  for (DType dt : kFloatTypes) {
    for (int trial = 0; trial < 24; ++trial) {
      const bool tanh_approx = trial % 2 == 1;
      Shape shape = random_shape(uniform_int(0, 3), 5, trial % 7 == 0);
      shape.push_back(random_cols());
      SCOPED_TRACE(describe("bias_gelu", shape, dt, tanh_approx ? "tanh" : "erf"));
      Tensor x = random_tensor(shape, dt, coin(), -5.0, 5.0);
      Tensor b = random_tensor({shape.back()}, dt, false, -1.0, 1.0);
      Tensor y = bias_gelu(x, b, tanh_approx);
      EXPECT_EQ(y.dtype(), dt);
      EXPECT_EQ(y.shape(), shape);
      const double tol = tolerance(dt);
      EXPECT_TRUE(all_close(y, reference::bias_gelu(ref(x), ref(b), tanh_approx), tol, tol)) << "forward";

      Tensor g = random_tensor(shape, dt, coin());
      auto grads =
          grads_through([&](const std::vector<Tensor>& in) { return bias_gelu(in[0], in[1], tanh_approx); }, {x, b}, g);
      const auto r = reference::bias_gelu_backward(ref(g), ref(x), ref(b), tanh_approx);
      const double gtol = grad_tolerance(dt);
      EXPECT_TRUE(all_close(grads[0], r.dx, gtol, gtol)) << "dx";
      // the bias gradient sums a column: absolute error grows with the rows
      const double rows = double(std::max<int64_t>(1, numel_of(shape) / shape.back()));
      EXPECT_TRUE(all_close(grads[1], r.dbias, gtol, gtol * rows)) << "dbias";
      EXPECT_EQ(grads[1].dtype(), dt);
    }
  }
}

TEST(BiasGelu, MatchesTheUnfusedComposition) {
  for (DType dt : {DType::f32, DType::bf16}) {
    for (bool tanh_approx : {false, true}) {
      const Shape shape{6, 7, 40};
      SCOPED_TRACE(describe("bias_gelu", shape, dt, tanh_approx ? "tanh" : "erf"));
      Tensor x = random_tensor(shape, dt, false, -6.0, 6.0);
      Tensor b = random_tensor({40}, dt);
      Tensor g = random_tensor(shape, dt);
      auto fused =
          grads_through([&](const std::vector<Tensor>& in) { return bias_gelu(in[0], in[1], tanh_approx); }, {x, b}, g);
      auto plain =
          grads_through([&](const std::vector<Tensor>& in) { return gelu(in[0] + in[1], tanh_approx); }, {x, b}, g);
      // the composition rounds x + b to the dtype first; the fused op does not
      const double tol = dt == DType::f32 ? 2e-5 : 3 * tolerance(dt);
      EXPECT_TRUE(all_close(bias_gelu(x, b, tanh_approx), gelu(x + b, tanh_approx), tol, tol));
      EXPECT_TRUE(all_close(fused[0], plain[0], tol, tol));
      EXPECT_TRUE(all_close(fused[1].to(DType::f32), plain[1].to(DType::f32), tol, 42 * tol));
    }
  }
}

TEST(BiasGelu, ExactGeluIsAccurateToFloatRounding) {
  // Far into the left tail gelu(x) is tiny; the erf form keeps its relative accuracy there.
  std::vector<float> xs;
  for (float v = -12.0f; v <= 12.0f; v += 0.0625f) xs.push_back(v);
  Tensor x = from_vector(xs, {int64_t(xs.size())});
  Tensor b = zeros({int64_t(xs.size())});
  EXPECT_TRUE(all_close(bias_gelu(x, b), reference::bias_gelu(ref(x), ref(b), false), 2e-6, 1e-37));
  EXPECT_TRUE(all_close(gelu(x), reference::bias_gelu(ref(x), ref(b), false), 2e-6, 1e-37));
}

TEST(BiasGelu, Gradcheck) {
  for (int trial = 0; trial < 6; ++trial) {
    const bool tanh_approx = trial % 2 == 0;
    Shape shape = random_shape(uniform_int(0, 2), 3);
    shape.push_back(uniform_int(1, 5));
    SCOPED_TRACE(describe("bias_gelu", shape, DType::f64, tanh_approx ? "tanh" : "erf"));
    Tensor x = random_tensor(shape, DType::f64, coin(), -3.0, 3.0).requires_grad_();
    Tensor b = random_tensor({shape.back()}, DType::f64).requires_grad_();
    expect_gradcheck(
        [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{bias_gelu(in[0], in[1], tanh_approx)}; },
        {x, b});
  }
}

TEST(BiasGelu, AutocastKeepsTheInputDtype) {
  Tensor x = random_tensor({4, 16}, DType::bf16).requires_grad_();
  Tensor b = random_tensor({16}, DType::f32).requires_grad_();
  Tensor y;
  {
    AutocastGuard ag(DeviceType::CPU, DType::bf16);
    y = bias_gelu(x, b);
  }
  EXPECT_EQ(y.dtype(), DType::bf16);
  y.sum().backward();
  ASSERT_TRUE(b.grad().defined());
  EXPECT_EQ(b.grad().dtype(), DType::f32);
  EXPECT_EQ(x.grad().dtype(), DType::bf16);
  // without autocast the dtypes promote, as gelu(x + b) would
  EXPECT_EQ(bias_gelu(x.detach(), b.detach()).dtype(), DType::f32);
}

TEST(BiasGelu, BadArgumentsNameTheOpAndShapes) {
  EXPECT_EMBER_ERROR(bias_gelu(zeros({3, 4}), zeros({5})), "bias_gelu", "[5]", "[3, 4]");
  EXPECT_EMBER_ERROR(bias_gelu(zeros({3, 4}, {DType::i64}), zeros({4}, {DType::i64})), "bias_gelu", "floating point",
                     "[3, 4]");
}

// ---------------------------------------------------------------- add_layer_norm

namespace {

struct AlnCase {
  DType x_dt, r_dt;
  Shape shape;
  int64_t norm_ndim;
  bool weight, bias, x_bias;
  double p;
};

std::string describe(const AlnCase& c) {
  return "add_layer_norm x " + std::string(dtype_name(c.x_dt)) + " residual " + dtype_name(c.r_dt) + " shape " +
         shape_str(c.shape) + " norm dims " + std::to_string(c.norm_ndim) + (c.weight ? " weight" : "") +
         (c.bias ? " bias" : "") + (c.x_bias ? " x_bias" : "") + " p " + std::to_string(c.p);
}

// Normalised rows of at least 3 elements: with 1 or 2 the gradient is all cancellation (for two
// values xhat = +-1 up to eps), and rounding dominates any tolerance.
AlnCase random_aln_case(DType x_dt, DType r_dt) {
  AlnCase c{
      x_dt, r_dt, random_shape(uniform_int(0, 2), 4), uniform_int(1, 2), coin(), coin(), coin(), coin() ? 0.0 : 0.3};
  if (c.norm_ndim == 2) c.shape.push_back(uniform_int(1, 3));
  c.shape.push_back(std::max<int64_t>(3, random_cols()));
  return c;
}

DType param_dtype(DType x_dt) { return x_dt == DType::f64 ? DType::f64 : DType::f32; }

}  // namespace

// max over rows of max|h| / std(h), at least 1, for h = dropout(x + x_bias) + residual: how much
// the normalisation magnifies an error in h relative to the values themselves.
double aln_condition(const RefTensor& x, const RefTensor& r, const RefTensor* xb, const RefTensor* keep, double p,
                     int64_t cols) {
  double worst = 1.0;
  const int64_t n = x.numel();
  for (int64_t row = 0; row * cols < n; ++row) {
    std::vector<double> h(static_cast<size_t>(cols));
    double mean = 0, peak = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = size_t(row * cols + c);
      double v = x.data[i] + (xb ? xb->data[size_t(c)] : 0.0);
      if (keep) v = keep->data[i] != 0.0 ? v / (1.0 - p) : 0.0;
      h[size_t(c)] = v + r.data[i];
      mean += h[size_t(c)] / double(cols);
      peak = std::max(peak, std::abs(h[size_t(c)]));
    }
    double var = 0;
    for (double v : h) var += (v - mean) * (v - mean) / double(cols);
    if (var > 0) worst = std::max(worst, peak / std::sqrt(var + 1e-5));
  }
  return worst;
}

TEST(AddLayerNorm, ForwardAndBackwardMatchReference) {
  std::vector<std::pair<DType, DType>> pairs;
  for (DType dt : kFloatTypes) pairs.push_back({dt, dt});
  pairs.insert(pairs.end(), {{DType::bf16, DType::f32}, {DType::f32, DType::bf16}, {DType::f16, DType::f32}});
  for (const auto& [x_dt, r_dt] : pairs) {
    for (int trial = 0; trial < 12; ++trial) {
      const AlnCase c = random_aln_case(x_dt, r_dt);
      SCOPED_TRACE(describe(c));
      const Shape ns(c.shape.end() - c.norm_ndim, c.shape.end());
      const DType pd = param_dtype(x_dt);
      Tensor x = random_tensor(c.shape, x_dt, coin());
      Tensor r = random_tensor(c.shape, r_dt, coin());
      Tensor w = c.weight ? random_tensor(ns, pd, false, 0.5, 1.5) : Tensor();
      Tensor b = c.bias ? random_tensor(ns, pd) : Tensor();
      Tensor xb = c.x_bias ? random_tensor(ns, pd) : Tensor();
      const GeneratorState st = default_generator().get_state();
      Tensor y = add_layer_norm(x, r, ns, w, b, 1e-5, c.p, true, xb);
      EXPECT_EQ(y.dtype(), promote_types(x_dt, r_dt));
      const RefTensor keep = reference::dropout_mask(c.shape, c.p, st);
      const RefTensor* kp = c.p > 0 ? &keep : nullptr;
      const RefTensor rw = w.defined() ? ref(w) : RefTensor(), rb = b.defined() ? ref(b) : RefTensor(),
                      rxb = xb.defined() ? ref(xb) : RefTensor();
      const RefTensor* pw = w.defined() ? &rw : nullptr;
      const RefTensor* pb = b.defined() ? &rb : nullptr;
      const RefTensor* pxb = xb.defined() ? &rxb : nullptr;
      const double tol = tolerance(y.dtype()) * 2;
      EXPECT_TRUE(
          all_close(y, reference::add_layer_norm(ref(x), ref(r), c.norm_ndim, pw, pb, pxb, kp, c.p, 1e-5), tol, tol))
          << "forward";

      Tensor g = random_tensor(c.shape, y.dtype(), coin());
      default_generator().set_state(st);  // the same dropout mask again
      auto grads = grads_through(
          [&](const std::vector<Tensor>& in) {
            return add_layer_norm(in[0], in[1], ns, in[2], in[3], 1e-5, c.p, true, in[4]);
          },
          {x, r, w, b, xb}, g);
      const auto rg = reference::add_layer_norm_backward(ref(g), ref(x), ref(r), c.norm_ndim, pw, pxb, kp, c.p, 1e-5);
      const double gtol = grad_tolerance(x_dt == DType::f64                         ? DType::f64
                                         : x_dt == DType::f32 && r_dt == DType::f32 ? DType::f32
                                                                                    : DType::bf16);
      const double rows = double(std::max<int64_t>(1, numel_of(c.shape) / numel_of(ns)));
      // dx carries rstd * (rounding of h): a row whose spread is small against its values (a
      // few columns, say) magnifies the input's rounding by |h| / std.
      const double gtol_dx = gtol * aln_condition(ref(x), ref(r), pxb, kp, c.p, numel_of(ns));
      EXPECT_TRUE(all_close(grads[0], rg.dx, gtol_dx, gtol_dx)) << "dx";
      EXPECT_TRUE(all_close(grads[1], rg.dresidual, gtol_dx, gtol_dx)) << "dresidual";
      EXPECT_EQ(grads[0].dtype(), x_dt);
      EXPECT_EQ(grads[1].dtype(), r_dt);
      if (w.defined()) {
        EXPECT_TRUE(all_close(grads[2], rg.dweight, gtol, gtol * rows)) << "dweight";
      }
      if (b.defined()) {
        EXPECT_TRUE(all_close(grads[3], rg.dbias, gtol, gtol * rows)) << "dbias";
      }
      if (xb.defined()) {
        EXPECT_TRUE(all_close(grads[4], rg.dx_bias, gtol, gtol * rows)) << "dx_bias";
      }
    }
  }
}

TEST(AddLayerNorm, MatchesTheUnfusedCompositionIncludingDropout) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const Shape shape{3, 5, 48};
    SCOPED_TRACE(describe("add_layer_norm", shape, dt));
    Tensor x = random_tensor(shape, dt), r = random_tensor(shape, DType::f32);
    Tensor w = random_tensor({48}, DType::f32, false, 0.5, 1.5), b = random_tensor({48}), xb = random_tensor({48});
    Tensor g = random_tensor(shape, DType::f32);
    const GeneratorState st = default_generator().get_state();
    auto fused = grads_through(
        [&](const std::vector<Tensor>& in) {
          return add_layer_norm(in[0], in[1], {48}, in[2], in[3], 1e-12, 0.25, true, in[4]);
        },
        {x, r, w, b, xb}, g);
    default_generator().set_state(st);
    Tensor y_fused = add_layer_norm(x, r, {48}, w, b, 1e-12, 0.25, true, xb);
    default_generator().set_state(st);
    auto plain = grads_through(
        [&](const std::vector<Tensor>& in) {
          return layer_norm(dropout(in[0] + in[4], 0.25, true) + in[1], {48}, in[2], in[3], 1e-12);
        },
        {x, r, w, b, xb}, g);
    default_generator().set_state(st);
    Tensor y_plain = layer_norm(dropout(x + xb, 0.25, true) + r, {48}, w, b, 1e-12);
    // the composition rounds x + x_bias and its dropout to x's dtype; the fused op keeps floats
    const double tol = dt == DType::f32 ? 2e-5 : 4 * tolerance(dt);
    EXPECT_TRUE(all_close(y_fused, y_plain, tol, tol));
    for (size_t i = 0; i < fused.size(); ++i)
      EXPECT_TRUE(all_close(fused[i].to(DType::f32), plain[i].to(DType::f32), tol, tol * 15)) << "input " << i;
  }
}

TEST(AddLayerNorm, BroadcastResidualAndEvaluationMode) {
  Tensor x = random_tensor({4, 6, 16}), pos = random_tensor({6, 16});
  Tensor w = random_tensor({16}), b = random_tensor({16});
  Tensor g = random_tensor({4, 6, 16});
  auto fused = grads_through(
      [&](const std::vector<Tensor>& in) { return add_layer_norm(in[0], in[1], {16}, in[2], in[3], 1e-5, 0.5, false); },
      {x, pos, w, b}, g);
  auto plain = grads_through(
      [&](const std::vector<Tensor>& in) { return layer_norm(in[0] + in[1], {16}, in[2], in[3]); }, {x, pos, w, b}, g);
  for (size_t i = 0; i < fused.size(); ++i) EXPECT_TRUE(all_close(fused[i], plain[i], 2e-5, 2e-5)) << "input " << i;
}

TEST(AddLayerNorm, Gradcheck) {
  for (int trial = 0; trial < 8; ++trial) {
    const bool with_w = coin(), with_b = coin(), with_xb = coin();
    const double p = trial % 2 ? 0.3 : 0.0;
    const Shape shape{uniform_int(1, 3), uniform_int(1, 5)};
    SCOPED_TRACE(describe("add_layer_norm", shape, DType::f64, "p " + std::to_string(p)));
    const Shape ns{shape.back()};
    std::vector<Tensor> inputs = {random_tensor(shape, DType::f64).requires_grad_(),
                                  random_tensor(shape, DType::f64).requires_grad_(),
                                  with_w ? random_tensor(ns, DType::f64).requires_grad_() : Tensor(),
                                  with_b ? random_tensor(ns, DType::f64).requires_grad_() : Tensor(),
                                  with_xb ? random_tensor(ns, DType::f64).requires_grad_() : Tensor()};
    std::vector<Tensor> checked;
    for (const Tensor& t : inputs)
      if (t.defined()) checked.push_back(t);
    expect_gradcheck(
        [&](const std::vector<Tensor>& in) {
          size_t k = 2;
          const Tensor w = with_w ? in[k++] : Tensor();
          const Tensor b = with_b ? in[k++] : Tensor();
          const Tensor xb = with_xb ? in[k++] : Tensor();
          manual_seed(11);  // the same dropout mask at every evaluation
          return std::vector<Tensor>{add_layer_norm(in[0], in[1], ns, w, b, 1e-5, p, true, xb)};
        },
        checked);
  }
}

TEST(AddLayerNorm, AutocastReturnsF32AndGradientsKeepTheirDtypes) {
  Tensor x = random_tensor({8, 32}, DType::bf16).requires_grad_();
  Tensor r = random_tensor({8, 32}, DType::f32).requires_grad_();
  Tensor w = ones({32}).requires_grad_(), b = zeros({32}).requires_grad_();
  Tensor y;
  {
    AutocastGuard ag(DeviceType::CPU, DType::bf16);
    y = add_layer_norm(x, r, {32}, w, b, 1e-5, 0.1, true);
    EXPECT_EQ(add_layer_norm(x.detach(), x.detach(), {32}).dtype(), DType::f32);
  }
  EXPECT_EQ(y.dtype(), DType::f32);
  y.sum().backward();
  EXPECT_EQ(x.grad().dtype(), DType::bf16);
  EXPECT_EQ(r.grad().dtype(), DType::f32);
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  // without autocast two bf16 inputs give bf16, as layer_norm(x + r) would
  EXPECT_EQ(add_layer_norm(x.detach(), x.detach(), {32}).dtype(), DType::bf16);
}

TEST(AddLayerNorm, SameResultsWhateverTheThreadCount) {
  Tensor x = random_tensor({300, 64}), r = random_tensor({300, 64}), w = random_tensor({64});
  auto run = [&] {
    manual_seed(5);
    Tensor wl = w.detach().requires_grad_();
    Tensor y = add_layer_norm(x, r, {64}, wl, Tensor(), 1e-5, 0.2, true);
    y.backward(y.detach());
    return cat({y.detach().reshape({-1}), wl.grad()});
  };
  auto [one, two] = with_one_and_two_threads(run);
  EXPECT_EQ(one.to_vector<float>(), two.to_vector<float>());
  // no dropout (x + residual in one pass), weight and bias, an odd row count (the threads' shares
  // pair rows differently) and a row length with a tail past the 8-lane blocks
  const Tensor xo = random_tensor({97, 261}), ro = random_tensor({97, 261}), wo = random_tensor({261}),
               bo = random_tensor({261}), g = random_tensor({97, 261});
  auto run_plain = [&] {
    Tensor xl = xo.detach().requires_grad_(), rl = ro.detach().requires_grad_();
    Tensor wl = wo.detach().requires_grad_(), bl = bo.detach().requires_grad_();
    Tensor y = add_layer_norm(xl, rl, {261}, wl, bl);
    y.backward(g);
    return cat({y.detach().reshape({-1}), xl.grad().reshape({-1}), rl.grad().reshape({-1}), wl.grad(), bl.grad()});
  };
  auto [one_plain, two_plain] = with_one_and_two_threads(run_plain);
  EXPECT_TRUE(same_bits(one_plain, two_plain));
}

TEST(AddLayerNorm, LeafInputsGetTheirOwnGradientsFromTheKernel) {
  // dx equals dresidual without dropout: one tensor for both, or (share = false, as autograd asks
  // when a leaf's accumulator would copy a shared tensor) two written by the kernel, same bits
  const Tensor x = random_tensor({37, 45}), r = random_tensor({37, 45}), w = random_tensor({45});
  const Tensor g = random_tensor({37, 45});
  const native::AddLayerNormResult fwd =
      native::add_layer_norm(x, r, {45}, w, Tensor(), Tensor(), 1e-5, 0.0, DType::f32);
  const auto backward = [&](bool share) {
    return native::add_layer_norm_backward(g, fwd.saved, w, DType::f32, DType::f32, 1.0, true, true, false, false,
                                           false, share);
  };
  const native::AddLayerNormGrads shared = backward(true), own = backward(false);
  EXPECT_EQ(shared.dx.raw_data(), shared.dresidual.raw_data());
  EXPECT_NE(own.dx.raw_data(), own.dresidual.raw_data());
  EXPECT_TRUE(same_bits(own.dx, shared.dx));
  EXPECT_TRUE(same_bits(own.dresidual, shared.dx));
  // through autograd, two leaves: their own buffers, the same values
  Tensor xl = x.detach().requires_grad_(), rl = r.detach().requires_grad_();
  add_layer_norm(xl, rl, {45}, w, Tensor()).backward(g);
  EXPECT_NE(xl.grad().raw_data(), rl.grad().raw_data());
  EXPECT_TRUE(same_bits(xl.grad(), shared.dx));
  EXPECT_TRUE(same_bits(rl.grad(), shared.dx));
}

TEST(AddLayerNorm, ARowGivesTheSameBitsAloneOrAmongOthers) {
  // the forward kernel takes rows two at a time (see LayerNorm's test of the same name), and a
  // backward that did must keep each row's dx and the row order of the dweight / dbias sums;
  // rows 4 on hold no NaN, so their dweight is not NaN throughout
  for_each_odd_row_count_case([](const Tensor& x) {
    const Tensor residual = random_tensor(x.shape(), DType::f32, false, -30.0, 30.0);
    const auto forward = [&](const Tensor& xs, int64_t first_row, const Tensor& w, const Tensor& b) {
      return add_layer_norm(xs, residual.narrow(0, first_row, xs.shape()[0]), {xs.shape()[1]}, w, b);
    };
    expect_rows_alone_as_among_others(x, forward);
    expect_rows_alone_as_among_others(x.narrow(0, 4, 5).contiguous(), [&](const Tensor& xs, int64_t first_row,
                                                                           const Tensor& w, const Tensor& b) {
      return forward(xs, first_row + 4, w, b);
    });
  });
}

TEST(AddLayerNorm, BadArgumentsNameTheOpAndShapes) {
  EXPECT_EMBER_ERROR(add_layer_norm(zeros({2, 8}), zeros({3, 8}), {8}), "add_layer_norm", "[3, 8]", "[2, 8]");
  EXPECT_EMBER_ERROR(add_layer_norm(zeros({2, 8}), zeros({2, 8}), {4}), "add_layer_norm", "normalized_shape", "[4]",
                     "[2, 8]");
  EXPECT_EMBER_ERROR(add_layer_norm(zeros({2, 8}), zeros({2, 8}), {8}, zeros({7})), "add_layer_norm", "weight", "[7]");
  EXPECT_EMBER_ERROR(add_layer_norm(zeros({2, 8}), zeros({2, 8}), {8}, Tensor(), Tensor(), 1e-5, 1.5, true),
                     "add_layer_norm", "[0, 1]", "[2, 8]");
}

// ---------------------------------------------------------------- scaled_masked_softmax

namespace {

// A mask shape that broadcasts to `shape`: some dims dropped from the front or set to 1.
Shape random_mask_shape(const Shape& shape) {
  Shape m(shape.begin() + uniform_int(0, int64_t(shape.size()) - 1), shape.end());
  for (size_t i = 0; i + 1 < m.size(); ++i)
    if (coin()) m[i] = 1;
  if (coin()) m.back() = 1;
  return m;
}

}  // namespace

TEST(ScaledMaskedSoftmax, ForwardAndBackwardMatchReference) {
  for (DType dt : kFloatTypes) {
    for (int trial = 0; trial < 16; ++trial) {
      Shape shape = random_shape(uniform_int(0, 3), 4);
      shape.push_back(trial % 5 == 0 ? 300 : random_cols());
      const bool with_mask = trial % 4 != 0;
      const Shape mshape = with_mask ? random_mask_shape(shape) : Shape{};
      const DType mdt = coin() ? dt : (dt == DType::f64 ? DType::f64 : DType::f32);
      const double p = coin() ? 0.0 : 0.2, scale = 0.125 + double(uniform_int(0, 8)) / 8;
      SCOPED_TRACE(describe(
          "scaled_masked_softmax", shape, dt,
          (with_mask ? "mask " + shape_str(mshape) + " " + dtype_name(mdt) : "no mask") + " p " + std::to_string(p)));
      Tensor x = random_tensor(shape, dt, coin(), -4.0, 4.0);
      Tensor mask = with_mask ? random_tensor(mshape, mdt, coin(), -6.0, 0.0) : Tensor();
      const GeneratorState st = default_generator().get_state();
      Tensor y = scaled_masked_softmax(x, mask, scale, p, true);
      EXPECT_EQ(y.dtype(), with_mask ? promote_types(dt, mdt) : dt);
      const RefTensor keep = reference::dropout_mask(shape, p, st);
      const RefTensor* kp = p > 0 ? &keep : nullptr;
      const RefTensor rm = with_mask ? ref(mask) : RefTensor();
      const RefTensor* pm = with_mask ? &rm : nullptr;
      const double tol = tolerance(dt);
      EXPECT_TRUE(all_close(y, reference::scaled_masked_softmax(ref(x), pm, scale, kp, p), tol, tol * 1e-2))
          << "forward";

      Tensor g = random_tensor(shape, y.dtype(), coin());
      default_generator().set_state(st);
      auto grads = grads_through(
          [&](const std::vector<Tensor>& in) { return scaled_masked_softmax(in[0], mask, scale, p, true); }, {x}, g);
      const double gtol = grad_tolerance(dt);
      EXPECT_TRUE(
          all_close(grads[0], reference::scaled_masked_softmax_backward(ref(g), ref(x), pm, scale, kp, p), gtol, gtol))
          << "backward";
      EXPECT_EQ(grads[0].dtype(), dt);
    }
  }
}

TEST(ScaledMaskedSoftmax, MatchesTheUnfusedCompositionIncludingDropout) {
  const Shape shape{2, 3, 17, 40};
  Tensor x = random_tensor(shape, DType::f32, false, -3.0, 3.0);
  Tensor mask = random_tensor({2, 1, 1, 40}, DType::f32, false, -5.0, 0.0);
  Tensor g = random_tensor(shape);
  const GeneratorState st = default_generator().get_state();
  auto fused = grads_through(
      [&](const std::vector<Tensor>& in) { return scaled_masked_softmax(in[0], in[1], 0.3, 0.1, true); }, {x, mask}, g);
  default_generator().set_state(st);
  auto plain =
      grads_through([&](const std::vector<Tensor>& in) { return dropout(softmax(in[0] * 0.3 + in[1], -1), 0.1, true); },
                    {x, mask}, g);
  default_generator().set_state(st);
  Tensor y_fused = scaled_masked_softmax(x, mask, 0.3, 0.1, true);
  default_generator().set_state(st);
  Tensor y_plain = dropout(softmax(x * 0.3 + mask, -1), 0.1, true);
  EXPECT_TRUE(all_close(y_fused, y_plain, 1e-5, 1e-7));
  EXPECT_TRUE(all_close(fused[0], plain[0], 1e-5, 1e-6)) << "dx";
  EXPECT_TRUE(all_close(fused[1], plain[1], 1e-5, 1e-5)) << "dmask";
}

TEST(ScaledMaskedSoftmax, MaskedEntriesGetNoWeight) {
  const float lowest = std::numeric_limits<float>::lowest(), inf = std::numeric_limits<float>::infinity();
  Tensor x = from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  Tensor mask = from_vector<float>({0, lowest, 0, -inf}, {4});
  auto y = scaled_masked_softmax(x, mask, 1.0).to_vector<float>();
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[3], 0.0f);
  EXPECT_NEAR(y[0] + y[2], 1.0f, 1e-6f);
  // a fully padded row (every key at the dtype's lowest value) gets uniform weights
  auto u = scaled_masked_softmax(x, full({4}, double(lowest)), 1.0).to_vector<float>();
  for (float v : u) EXPECT_NEAR(v, 0.25f, 1e-6f);
}

TEST(ScaledMaskedSoftmax, Gradcheck) {
  for (int trial = 0; trial < 6; ++trial) {
    const Shape shape{uniform_int(1, 3), uniform_int(1, 3), uniform_int(1, 6)};
    const double p = trial % 2 ? 0.25 : 0.0;
    SCOPED_TRACE(describe("scaled_masked_softmax", shape, DType::f64, "p " + std::to_string(p)));
    Tensor x = random_tensor(shape, DType::f64, coin()).requires_grad_();
    Tensor mask = random_tensor({1, shape[1], shape[2]}, DType::f64).requires_grad_();
    expect_gradcheck(
        [&](const std::vector<Tensor>& in) {
          manual_seed(3);
          return std::vector<Tensor>{scaled_masked_softmax(in[0], in[1], 0.7, p, true)};
        },
        {x, mask});
  }
}

TEST(ScaledMaskedSoftmax, AutocastReturnsF32) {
  Tensor x = random_tensor({2, 4, 8, 8}, DType::bf16).requires_grad_();
  Tensor mask = zeros({2, 1, 1, 8});
  Tensor y;
  {
    AutocastGuard ag(DeviceType::CPU, DType::bf16);
    y = scaled_masked_softmax(x, mask, 0.5, 0.1, true);
  }
  EXPECT_EQ(y.dtype(), DType::f32);
  y.sum().backward();
  EXPECT_EQ(x.grad().dtype(), DType::bf16);
  EXPECT_EQ(scaled_masked_softmax(x.detach(), Tensor(), 0.5).dtype(), DType::bf16);
}

TEST(ScaledMaskedSoftmax, SameResultsWhateverTheThreadCount) {
  Tensor x = random_tensor({8, 4, 32, 32});
  Tensor mask = random_tensor({8, 1, 1, 32}, DType::f32, false, -3.0, 0.0);
  auto run = [&] {
    manual_seed(9);
    Tensor xl = x.detach().requires_grad_();
    Tensor y = scaled_masked_softmax(xl, mask, 0.25, 0.1, true);
    y.backward(y.detach());
    return cat({y.detach().reshape({-1}), xl.grad().reshape({-1})});
  };
  auto [one, two] = with_one_and_two_threads(run);
  EXPECT_EQ(one.to_vector<float>(), two.to_vector<float>());
}

TEST(ScaledMaskedSoftmax, ARowGivesTheSameBitsAloneOrAmongOthers) {
  // the kernels take rows two at a time; an odd row count leaves one alone, and how rows pair
  // depends on where a thread's share starts, so each row's probabilities and gradient must come
  // out the same either way
  for_each_odd_row_count_case([](const Tensor& x) {
    const int64_t len = x.shape()[1];
    const Tensor mask = random_tensor({len}, DType::f32, false, -3.0, 0.0), g = random_tensor(x.shape());
    const auto y_dx = [&](const Tensor& xs, const Tensor& gs) {
      Tensor xl = xs.detach().requires_grad_();
      Tensor y = scaled_masked_softmax(xl, mask, 0.3);
      y.backward(gs.to(y.dtype()));
      return std::vector<Tensor>{y.detach(), xl.grad()};
    };
    const std::vector<Tensor> all = y_dx(x, g);
    for (int64_t r = 0; r < x.shape()[0]; ++r) {
      const std::vector<Tensor> alone = y_dx(x.narrow(0, r, 1).contiguous(), g.narrow(0, r, 1).contiguous());
      EXPECT_TRUE(same_bits(all[0].narrow(0, r, 1), alone[0])) << "y of row " << r;
      EXPECT_TRUE(same_bits(all[1].narrow(0, r, 1), alone[1])) << "dx of row " << r;
    }
  });
}

TEST(ScaledMaskedSoftmax, BadArgumentsNameTheOpAndShapes) {
  EXPECT_EMBER_ERROR(scaled_masked_softmax(zeros({2, 3, 4}), zeros({3, 3}), 1.0), "scaled_masked_softmax", "[3, 3]",
                     "[2, 3, 4]");
  EXPECT_EMBER_ERROR(scaled_masked_softmax(zeros({2, 4}, {DType::i32}), Tensor(), 1.0), "scaled_masked_softmax",
                     "floating point");
  EXPECT_EMBER_ERROR(scaled_masked_softmax(zeros({2, 4}), Tensor(), 1.0, -0.5, true), "scaled_masked_softmax", "[0, 1]",
                     "[2, 4]");
}

TEST(ScaledMaskedSoftmax, DtypeArgumentRoundsTheDefaultResultOnce) {
  Tensor x = random_tensor({3, 5, 24}, DType::bf16, false, -3.0, 3.0);
  Tensor mask = random_tensor({3, 1, 24}, DType::f32, false, -2.0, 0.0);
  AutocastGuard ag(DeviceType::CPU, DType::bf16);
  const GeneratorState st = default_generator().get_state();
  Tensor wide = scaled_masked_softmax(x, mask, 0.5, 0.2, true);
  default_generator().set_state(st);
  Tensor narrow = scaled_masked_softmax(x, mask, 0.5, 0.2, true, DType::bf16);
  EXPECT_EQ(wide.dtype(), DType::f32);
  EXPECT_EQ(narrow.dtype(), DType::bf16);
  EXPECT_EQ(narrow.to_vector<float>(), wide.to(DType::bf16).to_vector<float>());
}

// ---------------------------------------------------------------- packed_self_attention

namespace {

// The composition packed_self_attention stands for, from public ops.
Tensor packed_attention_composition(const Tensor& qkv, int64_t heads, const Tensor& mask, double p) {
  const int64_t b = qkv.size(0), len = qkv.size(1), e = qkv.size(2) / 3, d = e / heads;
  auto head = [&](int64_t i) { return qkv.narrow(2, i * e, e).view({b, len, heads, d}).transpose(1, 2); };
  Tensor scores = matmul(head(0), head(1).transpose(-2, -1)) * (1.0 / std::sqrt(double(d)));
  if (mask.defined()) scores = scores + mask;
  Tensor probs = dropout(softmax(scores, -1), p, true);
  return matmul(probs, head(2)).transpose(1, 2).reshape({b, len, e});
}

// An additive mask as BertModel builds it: the last `pad` keys of sequence i padded with the
// dtype's lowest value.
Tensor bert_like_mask_for_test(int64_t batch, int64_t len) {
  std::vector<float> m(static_cast<size_t>(batch * len), 0.0f);
  for (int64_t i = 0; i < batch; ++i)
    for (int64_t j = len - 3 * i; j < len; ++j) m[size_t(i * len + j)] = std::numeric_limits<float>::lowest();
  return from_vector(m, {batch, 1, 1, len});
}

}  // namespace

TEST(PackedSelfAttention, ForwardAndBackwardMatchReference) {
  // f16 has no kernel: it runs the composition, which must agree too
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    for (int trial = 0; trial < 8; ++trial) {
      const int64_t b = uniform_int(1, 3), len = uniform_int(1, 19), heads = uniform_int(1, 3), d = uniform_int(1, 9);
      const double p = trial % 2 ? 0.3 : 0.0;
      const bool with_mask = trial % 3 != 0;
      const Shape shape{b, len, 3 * heads * d};
      SCOPED_TRACE(describe("packed_self_attention", shape, dt,
                            "heads " + std::to_string(heads) + (with_mask ? " mask" : "") + " p " + std::to_string(p)));
      Tensor qkv = random_tensor(shape, dt, coin(), -1.5, 1.5);
      Tensor mask = with_mask ? random_tensor({b, 1, 1, len}, DType::f32, false, -4.0, 0.0) : Tensor();
      const GeneratorState st = default_generator().get_state();
      Tensor y = packed_self_attention(qkv, heads, mask, p, true);
      EXPECT_EQ(y.dtype(), dt);
      EXPECT_EQ(y.shape(), (Shape{b, len, heads * d}));
      const RefTensor keep = reference::dropout_mask({b, heads, len, len}, p, st);
      const RefTensor* kp = p > 0 ? &keep : nullptr;
      const RefTensor rm = with_mask ? ref(mask) : RefTensor();
      const RefTensor* pm = with_mask ? &rm : nullptr;
      // half types: the probabilities are rounded to them before the product with v
      const double tol = dt == DType::bf16 || dt == DType::f16 ? 3 * tolerance(dt) : tolerance(dt) * 10;
      EXPECT_TRUE(all_close(y, reference::packed_self_attention(ref(qkv), heads, pm, kp, p), tol, tol)) << "forward";

      Tensor g = random_tensor(y.shape(), dt, coin());
      default_generator().set_state(st);
      auto grads = grads_through(
          [&](const std::vector<Tensor>& in) { return packed_self_attention(in[0], heads, mask, p, true); }, {qkv}, g);
      const double gtol = dt == DType::bf16 || dt == DType::f16 ? 6 * tolerance(dt) : grad_tolerance(dt) * 10;
      EXPECT_TRUE(all_close(grads[0], reference::packed_self_attention_backward(ref(g), ref(qkv), heads, pm, kp, p),
                            gtol, gtol))
          << "backward";
      EXPECT_EQ(grads[0].dtype(), dt);
    }
  }
}

TEST(PackedSelfAttention, MatchesTheUnfusedCompositionIncludingDropout) {
  const Shape shape{3, 37, 3 * 4 * 16};
  Tensor qkv = random_tensor(shape, DType::f32, false, -2.0, 2.0);
  Tensor mask = bert_like_mask_for_test(3, 37);
  Tensor g = random_tensor({3, 37, 64});
  for (double p : {0.0, 0.1}) {
    SCOPED_TRACE("p " + std::to_string(p));
    const GeneratorState st = default_generator().get_state();
    auto fused = grads_through(
        [&](const std::vector<Tensor>& in) { return packed_self_attention(in[0], 4, mask, p, true); }, {qkv}, g);
    default_generator().set_state(st);
    auto plain = grads_through(
        [&](const std::vector<Tensor>& in) { return packed_attention_composition(in[0], 4, mask, p); }, {qkv}, g);
    default_generator().set_state(st);
    Tensor y_fused = packed_self_attention(qkv, 4, mask, p, true);
    default_generator().set_state(st);
    Tensor y_plain = packed_attention_composition(qkv, 4, mask, p);
    EXPECT_TRUE(all_close(y_fused, y_plain, 1e-5, 1e-6));
    EXPECT_TRUE(all_close(fused[0], plain[0], 1e-4, 1e-6));
  }
}

TEST(PackedSelfAttention, Gradcheck) {
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t heads = uniform_int(1, 2), d = uniform_int(1, 3), len = uniform_int(1, 4);
    const double p = trial % 2 ? 0.25 : 0.0;
    const Shape shape{uniform_int(1, 2), len, 3 * heads * d};
    SCOPED_TRACE(describe("packed_self_attention", shape, DType::f64, "p " + std::to_string(p)));
    Tensor qkv = random_tensor(shape, DType::f64).requires_grad_();
    Tensor mask = random_tensor({shape[0], 1, 1, len}, DType::f64, false, -1.0, 0.0);
    expect_gradcheck(
        [&](const std::vector<Tensor>& in) {
          manual_seed(4);
          return std::vector<Tensor>{packed_self_attention(in[0], heads, mask, p, true)};
        },
        {qkv});
  }
}

TEST(PackedSelfAttention, AutocastRunsInBf16AndSameResultsWhateverTheThreadCount) {
  Tensor qkv = random_tensor({2, 24, 3 * 32}).requires_grad_();
  Tensor y;
  {
    AutocastGuard ag(DeviceType::CPU, DType::bf16);
    y = packed_self_attention(qkv, 2, Tensor(), 0.1, true);
  }
  EXPECT_EQ(y.dtype(), DType::bf16);
  y.to(DType::f32).sum().backward();
  EXPECT_EQ(qkv.grad().dtype(), DType::f32);

  Tensor x = random_tensor({4, 33, 3 * 48});
  auto run = [&] {
    manual_seed(2);
    Tensor xl = x.detach().requires_grad_();
    Tensor out = packed_self_attention(xl, 3, Tensor(), 0.2, true);
    out.backward(out.detach());
    return cat({out.detach().reshape({-1}), xl.grad().reshape({-1})});
  };
  auto [one, two] = with_one_and_two_threads(run);
  EXPECT_EQ(one.to_vector<float>(), two.to_vector<float>());
}

TEST(PackedSelfAttention, BadArgumentsNameTheOpAndShapes) {
  EXPECT_EMBER_ERROR(packed_self_attention(zeros({2, 5, 30}), 4), "packed_self_attention", "[2, 5, 30]", "4 heads");
  EXPECT_EMBER_ERROR(packed_self_attention(zeros({10, 30}), 1), "packed_self_attention", "[10, 30]");
  EXPECT_EMBER_ERROR(packed_self_attention(zeros({2, 5, 24}), 2, zeros({3, 1, 1, 5})), "packed_self_attention",
                     "[3, 1, 1, 5]", "[2, 2, 5, 5]");
}

TEST(BiasGelu, WideAndBaselineKernelsAgree) {
  // The AVX-512 rows (when the CPU has them) and the AVX2 rows share their formulas.
  const CpuCapability saved = cpu_capability();
  for (DType dt : {DType::f32, DType::bf16}) {
    for (bool tanh_approx : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (tanh_approx ? " tanh" : " erf"));
      Tensor x = random_tensor({7, 45}, dt, false, -8.0, 8.0), b = random_tensor({45});
      Tensor g = random_tensor({7, 45}, dt);
      auto run = [&] {
        auto grads = grads_through([&](const std::vector<Tensor>& in) { return bias_gelu(in[0], in[1], tanh_approx); },
                                   {x, b}, g);
        return cat({bias_gelu(x, b, tanh_approx).to(DType::f32).reshape({-1}), grads[0].to(DType::f32).reshape({-1}),
                    grads[1], gelu(x, tanh_approx).to(DType::f32).reshape({-1})});
      };
      set_cpu_capability(CpuCapability::Avx2);
      const Tensor baseline = run();
      set_cpu_capability(CpuCapability::Avx512);  // capped at what the CPU has
      const Tensor wide = run();
      set_cpu_capability(saved);
      EXPECT_EQ(baseline.to_vector<float>(), wide.to_vector<float>());
    }
  }
}

// ---------------------------------------------------------------- the dropout mask stream

TEST(DropoutStream, EveryKernelPathMatchesTheReference) {
  // Lengths that leave partial Philox blocks and vector groups at both ends, offsets whose
  // counters carry into the high word, the AVX-512 and AVX2 kernels, one and two threads.
  const CpuCapability saved = cpu_capability();
  for (CpuCapability cap : {CpuCapability::Avx2, CpuCapability::Avx512}) {
    set_cpu_capability(cap);
    for (uint64_t offset : {uint64_t(0), uint64_t(3), (uint64_t(1) << 32) - 21, (uint64_t(5) << 32) - 2}) {
      for (int64_t n : {int64_t(1), int64_t(7), int64_t(61), int64_t(4099), int64_t(70001)}) {
        SCOPED_TRACE(std::string(cpu_capability_name(cpu_capability())) + " offset " + std::to_string(offset) + " n " +
                     std::to_string(n));
        Tensor x = random_tensor({n});
        default_generator().set_state({91, offset});
        auto [one, two] = with_one_and_two_threads([&] {
          default_generator().set_state({91, offset});
          return dropout(x, 0.35, true);
        });
        EXPECT_TRUE(all_close(one, reference::dropout(ref(x), 0.35, {91, offset}), 1e-6, 1e-7));
        EXPECT_EQ(one.to_vector<float>(), two.to_vector<float>());
      }
    }
  }
  set_cpu_capability(saved);
}

TEST(DropoutStream, KeepMaskIsThePhiloxStreamBitForBit) {
  // cpu::dropout_keep_mask on every kernel path against Philox::draw word by word: starts and
  // lengths that leave partial blocks and partial 16-block steps, counters that carry.
  const CpuCapability saved = cpu_capability();
  const uint32_t threshold = cpu::dropout_threshold(0.3);
  for (CpuCapability cap : {CpuCapability::Avx2, CpuCapability::Avx512}) {
    set_cpu_capability(cap);
    for (uint64_t offset : {uint64_t(0), (uint64_t(1) << 32) - 9, (uint64_t(7) << 32) - 1}) {
      for (auto [first, n] : {std::pair<int64_t, int64_t>{0, 64}, {1, 2}, {3, 61}, {6, 257}, {13, 4099}, {0, 8191}}) {
        SCOPED_TRACE(std::string(cpu_capability_name(cpu_capability())) + " offset " + std::to_string(offset) +
                     " first " + std::to_string(first) + " n " + std::to_string(n));
        const GeneratorState st{0x1234567890ABCDEFull, offset};
        std::vector<uint8_t> keep(size_t(n) + 1, 7);
        cpu::dropout_keep_mask(st, threshold, first, n, keep.data());
        int64_t wrong = 0;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t e = first + i;
          const uint32_t w = Philox::draw(st.seed, 0, offset + uint64_t(e / 4))[size_t(e % 4)];
          wrong += keep[size_t(i)] != ((w >> 8) >= threshold ? 1 : 0);
        }
        EXPECT_EQ(wrong, 0);
        EXPECT_EQ(keep[size_t(n)], 7);  // nothing written past n
      }
    }
  }
  set_cpu_capability(saved);
}
