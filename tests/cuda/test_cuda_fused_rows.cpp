// CUDA residual add + layer norm and scale + mask + softmax (core/native/fused.h), forward and
// backward: against the double reference, and, where dropout draws, against the CPU kernel run
// with the same generator state (the keep masks must agree bit for bit). Mixed input and output
// dtypes, undefined optional inputs and outputs, masks broadcast through stride-0 dims
// ([B, 1, 1, L] over [B, H, L, L]) and non-contiguous ones, rows short enough for one warp and
// longer than 1024, lengths that are not multiples of 4, fully masked rows. Outputs start out
// poisoned (NaN, or true for keep masks) so that an element the kernel never wrote shows.
// Every test skips without a CUDA device.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "core/device_api.h"
#include "core/native/fused.h"
#include "kernels/reference/fused.h"
#include "kernels/reference/nn_functional.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_tensor;
using ember::testing::tolerance;
using ember::testing::uniform_int;
using reference::RefTensor;

namespace {

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();
constexpr double kEps = 1e-5;

RefTensor ref(const Tensor& t) { return reference::from_tensor(t); }
Tensor on(const Tensor& t, Device d) { return t.defined() ? t.to(d) : Tensor(); }
DType compute_of(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

// Backward results subtract nearly equal terms; half-precision outputs show in absolute terms.
double grad_tol(DType dt) { return dt == DType::f64 ? 1e-9 : dt == DType::f32 ? 2e-5 : 4 * tolerance(dt); }

// The loosest of the tolerances of some dtypes.
double loosest(std::initializer_list<DType> dts) {
  double t = 0;
  for (DType dt : dts) t = std::max(t, tolerance(dt));
  return t;
}

// A generator state at a random seed and an offset that may carry into the counter's high word.
GeneratorState random_state() {
  const uint64_t offsets[] = {0, 3, (uint64_t(1) << 32) - 5};
  return {uint64_t(uniform_int(1, int64_t(1) << 40)), offsets[uniform_int(0, 2)]};
}

// Equal element for element (keep masks); names the first difference.
::testing::AssertionResult same_values(const Tensor& actual, const RefTensor& expected) {
  const RefTensor a = ref(actual);
  if (a.data.size() != expected.data.size())
    return ::testing::AssertionFailure() << "sizes " << a.data.size() << " vs " << expected.data.size();
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < a.data.size(); ++i) {
    if (a.data[i] != expected.data[i]) {
      if (first < 0) first = int64_t(i);
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << a.data.size() << " differ, first at " << first << ": "
                                       << a.data[size_t(first)] << " vs " << expected.data[size_t(first)];
}

// Sums over the rows of a [rows, cols] reference tensor.
RefTensor column_sums(const RefTensor& t, int64_t rows, int64_t cols) {
  RefTensor out({cols});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out.data[size_t(c)] += t.data[size_t(r * cols + c)];
  return out;
}

// ---------------------------------------------------------------- add_layer_norm

struct AlnCase {
  int64_t rows, cols;
  DType x_dt, r_dt, y_dt;
  bool weight, bias, x_bias;
  double p;
};

std::string describe(const AlnCase& c) {
  return "add_layer_norm [" + std::to_string(c.rows) + ", " + std::to_string(c.cols) + "] x " + dtype_name(c.x_dt) +
         " residual " + dtype_name(c.r_dt) + " y " + dtype_name(c.y_dt) + (c.weight ? " weight" : "") +
         (c.bias ? " bias" : "") + (c.x_bias ? " x_bias" : "") + " p " + std::to_string(c.p);
}

std::vector<AlnCase> aln_cases() {
  struct Types {
    DType x, r, y;
  };
  const std::vector<Types> types = {{DType::f32, DType::f32, DType::f32},   {DType::bf16, DType::f32, DType::bf16},
                                    {DType::f32, DType::bf16, DType::f32},  {DType::f16, DType::f16, DType::f16},
                                    {DType::f16, DType::bf16, DType::f32},  {DType::bf16, DType::bf16, DType::f16},
                                    {DType::f64, DType::f64, DType::f64}};
  std::vector<std::pair<int64_t, int64_t>> sizes = {{7, 1},    {5, 3},    {9, 32},   {4, 33},  {3, 1024},
                                                    {3, 1025}, {2, 3001}, {300, 13}, {1, 7},   {40, 70}};
  sizes.push_back({uniform_int(1, 70), uniform_int(1, 300)});
  sizes.push_back({uniform_int(1, 4), uniform_int(1025, 5000)});
  std::vector<AlnCase> cases;
  int v = 0;
  for (const auto& [rows, cols] : sizes) {
    for (const Types& t : types) {
      cases.push_back({rows, cols, t.x, t.r, t.y, v % 2 == 0, v % 3 != 0, v % 4 < 2, v % 3 == 1 ? 0.3 : 0.0});
      ++v;
    }
  }
  return cases;
}

// What one forward run produced (on either device).
struct AlnForward {
  Tensor y, h, mean, rstd, keep;
};

AlnForward run_aln_forward(Device dev, const AlnCase& c, const Tensor& x, const Tensor& r, const Tensor& xb,
                           const Tensor& w, const Tensor& b, const native::FusedDropout& d) {
  const DType cd = compute_of(c.x_dt);
  AlnForward f;
  f.y = full({c.rows, c.cols}, kNaN, {c.y_dt, dev});
  f.h = full({c.rows, c.cols}, kNaN, {cd, dev});
  f.mean = full({c.rows}, kNaN, {cd, dev});
  f.rstd = full({c.rows}, kNaN, {cd, dev});
  if (d.active()) f.keep = full({c.rows, c.cols}, 1.0, {DType::boolean, dev});
  native::add_layer_norm_stub.call(dev, "add_layer_norm")(f.y, f.h, f.mean, f.rstd, f.keep, x.to(dev), r.to(dev),
                                                         on(xb, dev), on(w, dev), on(b, dev), kEps, d);
  return f;
}

// h = dropout(x + x_bias) + residual in double, from the inputs and the keep mask (or null).
RefTensor reference_h(const AlnCase& c, const RefTensor& x, const RefTensor& r, const RefTensor* xb,
                      const RefTensor* keep) {
  RefTensor h({c.rows, c.cols});
  for (int64_t i = 0; i < c.rows * c.cols; ++i) {
    double v = x.data[size_t(i)] + (xb ? xb->data[size_t(i % c.cols)] : 0.0);
    if (keep) v *= keep->data[size_t(i)] != 0 ? 1.0 / (1.0 - c.p) : 0.0;
    h.data[size_t(i)] = v + r.data[size_t(i)];
  }
  return h;
}

void reference_stats(const RefTensor& h, int64_t rows, int64_t cols, RefTensor& mean, RefTensor& rstd) {
  mean = RefTensor({rows});
  rstd = RefTensor({rows});
  for (int64_t i = 0; i < rows; ++i) {
    double s = 0;
    for (int64_t j = 0; j < cols; ++j) s += h.data[size_t(i * cols + j)];
    const double m = s / double(cols);
    double v = 0;
    for (int64_t j = 0; j < cols; ++j) v += (h.data[size_t(i * cols + j)] - m) * (h.data[size_t(i * cols + j)] - m);
    mean.data[size_t(i)] = m;
    rstd.data[size_t(i)] = 1.0 / std::sqrt(v / double(cols) + kEps);
  }
}

}  // namespace

TEST(CudaAddLayerNorm, ForwardAndBackwardMatchReferenceAndCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  int variant = 0;
  for (const AlnCase& c : aln_cases()) {
    SCOPED_TRACE(describe(c));
    const DType cd = compute_of(c.x_dt);
    const Tensor x = random_tensor({c.rows, c.cols}, c.x_dt);
    const Tensor r = random_tensor({c.rows, c.cols}, c.r_dt, false, -3.0, 5.0);
    const Tensor w = c.weight ? random_tensor({c.cols}, cd, false, 0.5, 1.5) : Tensor();
    const Tensor b = c.bias ? random_tensor({c.cols}, cd) : Tensor();
    const Tensor xb = c.x_bias ? random_tensor({c.cols}, cd) : Tensor();
    Generator gen;
    gen.set_state(random_state());
    const native::FusedDropout d = native::make_fused_dropout(c.p, c.rows * c.cols, "add_layer_norm", gen);

    const AlnForward gpu = run_aln_forward(kGpu, c, x, r, xb, w, b, d);
    const AlnForward cpu = run_aln_forward(kCpu, c, x, r, xb, w, b, d);

    // the keep mask, bit for bit
    const RefTensor keep = reference::dropout_mask({c.rows, c.cols}, c.p, d.state);
    const RefTensor* kp = d.active() ? &keep : nullptr;
    if (d.active()) {
      EXPECT_TRUE(same_values(gpu.keep, ref(cpu.keep))) << "keep vs CPU";
      EXPECT_TRUE(same_values(gpu.keep, keep)) << "keep vs reference";
    }
    const RefTensor rx = ref(x), rr = ref(r);
    const RefTensor rw = c.weight ? ref(w) : RefTensor(), rb = c.bias ? ref(b) : RefTensor(),
                    rxb = c.x_bias ? ref(xb) : RefTensor();
    const RefTensor* pw = c.weight ? &rw : nullptr;
    const RefTensor* pb = c.bias ? &rb : nullptr;
    const RefTensor* pxb = c.x_bias ? &rxb : nullptr;

    const double ctol = tolerance(cd);
    const RefTensor want_h = reference_h(c, rx, rr, pxb, kp);
    EXPECT_TRUE(all_close(gpu.h, want_h, ctol, ctol)) << "h";
    EXPECT_TRUE(all_close(gpu.h, cpu.h, ctol, ctol)) << "h vs CPU";
    RefTensor want_mean, want_rstd;
    reference_stats(want_h, c.rows, c.cols, want_mean, want_rstd);
    EXPECT_TRUE(all_close(gpu.mean, want_mean, ctol, ctol)) << "mean";
    EXPECT_TRUE(all_close(gpu.rstd, want_rstd, 2 * ctol, ctol)) << "rstd";
    const double ytol = 2 * tolerance(c.y_dt);
    EXPECT_TRUE(all_close(gpu.y, reference::add_layer_norm(rx, rr, 1, pw, pb, pxb, kp, c.p, kEps), ytol, ytol)) << "y";
    EXPECT_TRUE(all_close(gpu.y, cpu.y, ytol, ytol)) << "y vs CPU";

    // backward from the saved tensors, a different set of outputs each time
    const int which = variant++ % 5;
    const bool want_dx = which == 0 || which == 4, want_dres = which <= 1, want_dxb = which == 0 || which >= 2,
               want_dw = which == 0 || which == 3, want_db = which == 0 || which == 3;
    SCOPED_TRACE("backward outputs: " + std::string(want_dx ? "dx " : "") + (want_dres ? "dresidual " : "") +
                 (want_dxb ? "dx_bias " : "") + (want_dw ? "dweight " : "") + (want_db ? "dbias" : ""));
    const DType dx_dt = cd == DType::f64 ? cd : c.x_dt, dres_dt = cd == DType::f64 ? cd : c.r_dt;
    const Tensor g = random_tensor({c.rows, c.cols}, c.y_dt);
    struct Grads {
      Tensor dx, dres, dxb, dw, db;
    };
    auto run_backward = [&](Device dev, const AlnForward& f) {
      Grads o;
      if (want_dx) o.dx = full({c.rows, c.cols}, kNaN, {dx_dt, dev});
      if (want_dres) o.dres = full({c.rows, c.cols}, kNaN, {dres_dt, dev});
      if (want_dxb) o.dxb = full({c.cols}, kNaN, {cd, dev});
      if (want_dw) o.dw = full({c.cols}, kNaN, {cd, dev});
      if (want_db) o.db = full({c.cols}, kNaN, {cd, dev});
      native::add_layer_norm_backward_stub.call(dev, "add_layer_norm_backward")(
          o.dx, o.dres, o.dxb, o.dw, o.db, g.to(dev), f.h, f.mean, f.rstd, on(w, dev), f.keep, d.scale);
      return o;
    };
    const Grads gg = run_backward(kGpu, gpu);
    const Grads gc = run_backward(kCpu, cpu);
    const reference::AddLayerNormGrads want =
        reference::add_layer_norm_backward(ref(g), rx, rr, 1, pw, pxb, kp, c.p, kEps);
    const double rows = double(c.rows);
    const double stol = grad_tol(cd);
    if (want_dx) {
      const double t = std::max(grad_tol(dx_dt), grad_tol(cd));
      EXPECT_TRUE(all_close(gg.dx, want.dx, t, t)) << "dx";
      EXPECT_TRUE(all_close(gg.dx, gc.dx, t, t)) << "dx vs CPU";
    }
    if (want_dres) {
      const double t = std::max(grad_tol(dres_dt), grad_tol(cd));
      EXPECT_TRUE(all_close(gg.dres, want.dresidual, t, t)) << "dresidual";
      EXPECT_TRUE(all_close(gg.dres, gc.dres, t, t)) << "dresidual vs CPU";
    }
    if (want_dxb) {
      EXPECT_TRUE(all_close(gg.dxb, column_sums(want.dx, c.rows, c.cols), stol, stol * rows)) << "dx_bias";
      EXPECT_TRUE(all_close(gg.dxb, gc.dxb, stol, stol * rows)) << "dx_bias vs CPU";
    }
    if (want_dw) {
      EXPECT_TRUE(all_close(gg.dw, want.dweight, stol, stol * rows)) << "dweight";
      EXPECT_TRUE(all_close(gg.dw, gc.dw, stol, stol * rows)) << "dweight vs CPU";
    }
    if (want_db) {
      EXPECT_TRUE(all_close(gg.db, want.dbias, stol, stol * rows)) << "dbias";
      EXPECT_TRUE(all_close(gg.db, gc.db, stol, stol * rows)) << "dbias vs CPU";
    }
    // the column sums are the same from run to run
    if (which == 0) {
      const Grads again = run_backward(kGpu, gpu);
      EXPECT_TRUE(same_values(again.dw, ref(gg.dw))) << "dweight run to run";
      EXPECT_TRUE(same_values(again.db, ref(gg.db))) << "dbias run to run";
      EXPECT_TRUE(same_values(again.dxb, ref(gg.dxb))) << "dx_bias run to run";
    }
  }
}

TEST(CudaAddLayerNorm, PublicOpMatchesCpuWithSeveralNormalizedDims) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  struct Case {
    Shape shape, normalized;
    DType x_dt, r_dt, out_dt;
    double p;
  };
  const std::vector<Case> cases = {
      {{3, 4, 5, 7}, {5, 7}, DType::bf16, DType::f32, DType::f32, 0.2},
      {{2, 6, 1100}, {1100}, DType::f16, DType::bf16, DType::bf16, 0.1},
      {{5, 3, 3, 3}, {3, 3, 3}, DType::f32, DType::f32, DType::f16, 0.0},
      {{4, 2, 9}, {2, 9}, DType::f64, DType::f64, DType::f64, 0.4},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("add_layer_norm " + shape_str(c.shape) + " over " + shape_str(c.normalized) + " x " +
                 dtype_name(c.x_dt) + " residual " + dtype_name(c.r_dt) + " out " + dtype_name(c.out_dt));
    const DType cd = compute_of(c.x_dt);
    const Tensor x = random_tensor(c.shape, c.x_dt), r = random_tensor(c.shape, c.r_dt);
    const Tensor w = random_tensor(c.normalized, cd, false, 0.5, 1.5), b = random_tensor(c.normalized, cd),
                 xb = random_tensor(c.normalized, cd);
    const GeneratorState st = random_state();
    Generator gen_gpu, gen_cpu;
    gen_gpu.set_state(st);
    gen_cpu.set_state(st);
    const native::AddLayerNormResult fg = native::add_layer_norm(
        x.to(kGpu), r.to(kGpu), c.normalized, w.to(kGpu), b.to(kGpu), xb.to(kGpu), kEps, c.p, c.out_dt, gen_gpu);
    const native::AddLayerNormResult fc =
        native::add_layer_norm(x, r, c.normalized, w, b, xb, kEps, c.p, c.out_dt, gen_cpu);
    ASSERT_EQ(fg.y.device(), kGpu);
    ASSERT_EQ(fg.y.shape(), c.shape);
    const double ytol = 2 * tolerance(c.out_dt), ctol = tolerance(cd);
    EXPECT_TRUE(all_close(fg.y, fc.y, ytol, ytol)) << "y";
    EXPECT_TRUE(all_close(fg.saved.h, fc.saved.h, ctol, ctol)) << "h";
    EXPECT_TRUE(all_close(fg.saved.mean, fc.saved.mean, ctol, ctol)) << "mean";
    EXPECT_TRUE(all_close(fg.saved.rstd, fc.saved.rstd, 2 * ctol, ctol)) << "rstd";
    ASSERT_EQ(fg.saved.keep.defined(), c.p > 0);
    if (c.p > 0) {
      EXPECT_TRUE(same_values(fg.saved.keep, ref(fc.saved.keep))) << "keep";
    }

    const Tensor g = random_tensor(c.shape, c.out_dt);
    const double scale = c.p > 0 ? 1.0 / (1.0 - c.p) : 1.0;
    const native::AddLayerNormGrads bg = native::add_layer_norm_backward(
        g.to(kGpu), fg.saved, w.to(kGpu), c.x_dt, c.r_dt, scale, true, true, true, true, true);
    const native::AddLayerNormGrads bc =
        native::add_layer_norm_backward(g, fc.saved, w, c.x_dt, c.r_dt, scale, true, true, true, true, true);
    const double t = std::max(grad_tol(c.x_dt), std::max(grad_tol(c.r_dt), grad_tol(c.out_dt)));
    const double rows = double(numel_of(c.shape) / numel_of(c.normalized));
    EXPECT_TRUE(all_close(bg.dx, bc.dx, t, t)) << "dx";
    EXPECT_TRUE(all_close(bg.dresidual, bc.dresidual, t, t)) << "dresidual";
    EXPECT_TRUE(all_close(bg.dx_bias, bc.dx_bias, t, t * rows)) << "dx_bias";
    EXPECT_TRUE(all_close(bg.dweight, bc.dweight, t, t * rows)) << "dweight";
    EXPECT_TRUE(all_close(bg.dbias, bc.dbias, t, t * rows)) << "dbias";
    EXPECT_EQ(bg.dx.dtype(), c.x_dt);
    EXPECT_EQ(bg.dresidual.dtype(), c.r_dt);
  }
}

TEST(CudaAddLayerNorm, UndefinedForwardOutputsAreSkipped) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  // Without h the later passes recompute it; y alone, or only the statistics, still come out right.
  const int64_t rows = 6, cols = 1300;
  const Tensor x = random_tensor({rows, cols}, DType::bf16), r = random_tensor({rows, cols});
  const Tensor w = random_tensor({cols}, DType::f32, false, 0.5, 1.5);
  const native::FusedDropout none;
  const Tensor y_full = full({rows, cols}, kNaN, {DType::f32, kGpu}), h = full({rows, cols}, kNaN, {DType::f32, kGpu});
  const Tensor mean_full = full({rows}, kNaN, {DType::f32, kGpu}), rstd_full = full({rows}, kNaN, {DType::f32, kGpu});
  auto stub = native::add_layer_norm_stub.call(kGpu, "add_layer_norm");
  stub(y_full, h, mean_full, rstd_full, Tensor(), x.to(kGpu), r.to(kGpu), Tensor(), w.to(kGpu), Tensor(), kEps, none);
  const Tensor y = full({rows, cols}, kNaN, {DType::f32, kGpu}), mean = full({rows}, kNaN, {DType::f32, kGpu});
  stub(y, Tensor(), mean, Tensor(), Tensor(), x.to(kGpu), r.to(kGpu), Tensor(), w.to(kGpu), Tensor(), kEps, none);
  EXPECT_TRUE(all_close(y, y_full, 1e-6, 1e-6)) << "y without h";
  EXPECT_TRUE(all_close(mean, mean_full, 0.0, 0.0)) << "mean without h";
  const Tensor rstd = full({rows}, kNaN, {DType::f32, kGpu});
  stub(Tensor(), Tensor(), Tensor(), rstd, Tensor(), x.to(kGpu), r.to(kGpu), Tensor(), w.to(kGpu), Tensor(), kEps,
       none);
  EXPECT_TRUE(all_close(rstd, rstd_full, 1e-6, 0.0)) << "rstd alone";
}

TEST(CudaAddLayerNorm, NoRowsGiveZeroColumnSums) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType cd : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(cd));
    const Tensor dxb = full({5}, kNaN, {cd, kGpu}), dw = full({5}, kNaN, {cd, kGpu}), db = full({5}, kNaN, {cd, kGpu});
    const Tensor none = zeros({0, 5}, {cd, kGpu}), stats = zeros({0}, {cd, kGpu});
    native::add_layer_norm_backward_stub.call(kGpu, "add_layer_norm_backward")(
        Tensor(), Tensor(), dxb, dw, db, none, none, stats, stats, Tensor(), Tensor(), 1.0);
    for (const Tensor& t : {dxb, dw, db}) EXPECT_TRUE(all_close(t, zeros({5}, {cd}), 0.0, 0.0));
  }
}

TEST(CudaAddLayerNorm, IntegerInputRaises) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Tensor xi = zeros({2, 4}, {DType::i32, kGpu});
  const Tensor y = zeros({2, 4}, {DType::f32, kGpu}), h = zeros({2, 4}, {DType::f32, kGpu});
  const Tensor st = zeros({2}, {DType::f32, kGpu});
  EXPECT_EMBER_ERROR(native::add_layer_norm_stub.call(kGpu, "add_layer_norm")(
                         y, h, st, st, Tensor(), xi, y, Tensor(), Tensor(), Tensor(), kEps, native::FusedDropout{}),
                     "add_layer_norm", "input", "floating point", "int32");
}

// ---------------------------------------------------------------- scaled_masked_softmax

namespace {

struct SmCase {
  Shape shape;
  Shape mask_shape;  // empty: no mask
  DType x_dt, mask_dt, y_dt;
  double scale, p;
  bool mask_transposed = false;  // the mask a transposed view (its last two dims swapped)
  bool some_inf = false;         // some mask entries -inf (never a whole row)
};

std::string describe(const SmCase& c) {
  return "scaled_masked_softmax " + shape_str(c.shape) + " x " + dtype_name(c.x_dt) +
         (c.mask_shape.empty() ? std::string(" no mask")
                               : " mask " + shape_str(c.mask_shape) + " " + dtype_name(c.mask_dt) +
                                     (c.mask_transposed ? " transposed" : "") + (c.some_inf ? " with -inf" : "")) +
         " y " + dtype_name(c.y_dt) + " scale " + std::to_string(c.scale) + " p " + std::to_string(c.p);
}

std::vector<SmCase> sm_cases() {
  struct Types {
    DType x, m, y;
  };
  const std::vector<Types> types = {{DType::f32, DType::f32, DType::f32},   {DType::bf16, DType::f32, DType::f32},
                                    {DType::f16, DType::f16, DType::f16},   {DType::bf16, DType::bf16, DType::bf16},
                                    {DType::f32, DType::bf16, DType::f32},  {DType::f64, DType::f64, DType::f64},
                                    {DType::f32, DType::f16, DType::bf16},  {DType::f64, DType::f32, DType::f64}};
  struct Geometry {
    Shape shape, mask;
    bool transposed;
  };
  std::vector<Geometry> geoms = {
      {{3, 17}, {}, false},
      {{5, 32}, {5, 32}, false},
      {{2, 3, 9, 9}, {2, 1, 1, 9}, false},           // BERT-style padding mask
      {{2, 4, 33, 1024}, {2, 1, 1, 1024}, false},    // longest warp row
      {{2, 3, 5, 1025}, {2, 1, 1, 1025}, false},     // shortest block row
      {{2, 2, 3001}, {1, 2, 3001}, false},           // long rows, broadcast batch
      {{4, 6, 7}, {6, 7}, false},                    // leading dim broadcast
      {{3, 5, 11}, {3, 5, 1}, false},                // mask constant along the row (stride 0 last dim)
      {{6, 13}, {6, 13}, true},                      // transposed mask
      {{2, 3, 21, 21}, {1, 3, 21, 21}, true},        // transposed, broadcast over the batch
      {{1, 1}, {1}, false},                          // a single element
      {{6, 1}, {}, false},                           // rows of one
      // nine leading dims that do not merge: more than the kernel indexes, read through a copy
      {{2, 2, 2, 2, 2, 2, 2, 2, 2, 5}, {2, 1, 2, 1, 2, 1, 2, 1, 2, 5}, false},
  };
  geoms.push_back({{uniform_int(1, 3), uniform_int(1, 4), uniform_int(1, 40), uniform_int(1, 1500)}, {}, false});
  geoms.back().mask = {geoms.back().shape[0], 1, 1, geoms.back().shape[3]};
  std::vector<SmCase> cases;
  int v = 0;
  for (const Geometry& g : geoms) {
    for (const Types& t : types) {
      SmCase c{g.shape, g.mask, t.x, t.m, t.y, v % 2 ? 0.125 : 0.9, v % 3 == 1 ? 0.25 : 0.0, g.transposed,
               !g.mask.empty() && v % 4 == 3 && g.shape.back() > 1};
      cases.push_back(c);
      ++v;
    }
  }
  return cases;
}

Tensor make_mask(const SmCase& c) {
  if (c.mask_shape.empty()) return Tensor();
  Tensor m = random_tensor(c.mask_shape, c.mask_dt, false, -6.0, 0.0);
  if (c.some_inf) {
    // -inf at some entries outside the first column, so no row is masked everywhere
    RefTensor r = ref(m);
    const int64_t len = c.mask_shape.back();
    for (int64_t i = 0; i < r.numel(); ++i)
      if (i % len != 0 && uniform_int(0, 3) == 0) r.data[size_t(i)] = -kInf;
    m = reference::to_tensor(r, c.mask_dt);
  }
  return m;
}

// The mask on `dev`, broadcast to x's shape as the stub takes it; a transposed case reads the
// same values through a view whose last two dims are swapped in memory.
Tensor mask_on(const SmCase& c, const Tensor& mask, Device dev) {
  if (!mask.defined()) return Tensor();
  Tensor m = mask.to(dev);
  if (c.mask_transposed) m = m.transpose(-1, -2).contiguous().transpose(-1, -2);
  return m.expand(c.shape);
}

struct SmForward {
  Tensor y, stats, keep;
};

SmForward run_sm_forward(Device dev, const SmCase& c, const Tensor& x, const Tensor& mask,
                         const native::FusedDropout& d) {
  const int64_t len = c.shape.back(), rows = numel_of(c.shape) / len;
  SmForward f;
  f.y = full(c.shape, kNaN, {c.y_dt, dev});
  f.stats = full({rows, 2}, kNaN, {compute_of(c.x_dt), dev});
  if (d.active()) f.keep = full(c.shape, 1.0, {DType::boolean, dev});
  native::scaled_masked_softmax_stub.call(dev, "scaled_masked_softmax")(f.y, f.stats, f.keep, x.to(dev),
                                                                        mask_on(c, mask, dev), c.scale, d);
  return f;
}

// Row max of x * scale + mask and 1 / sum exp(v - max), in double.
RefTensor reference_softmax_stats(const RefTensor& x, const RefTensor* mask, double scale) {
  const int64_t len = x.shape.back(), rows = x.numel() / len;
  RefTensor st({rows, 2});
  std::vector<double> v(static_cast<size_t>(len));
  for (int64_t r = 0; r < rows; ++r) {
    double m = -kInf;
    for (int64_t j = 0; j < len; ++j) {
      const int64_t i = r * len + j;
      v[size_t(j)] = x.data[size_t(i)] * scale + (mask ? mask->broadcast_at(reference::unravel(i, x.shape), x.shape) : 0);
      m = std::max(m, v[size_t(j)]);
    }
    double s = 0;
    for (int64_t j = 0; j < len; ++j) s += std::exp(v[size_t(j)] - m);
    st.data[size_t(2 * r)] = m;
    st.data[size_t(2 * r + 1)] = 1.0 / s;
  }
  return st;
}

}  // namespace

TEST(CudaScaledMaskedSoftmax, ForwardAndBackwardMatchReferenceAndCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  int variant = 0;
  for (const SmCase& c : sm_cases()) {
    SCOPED_TRACE(describe(c));
    const DType cd = compute_of(c.x_dt);
    const Tensor x = random_tensor(c.shape, c.x_dt, false, -4.0, 4.0);
    const Tensor mask = make_mask(c);
    Generator gen;
    gen.set_state(random_state());
    const native::FusedDropout d = native::make_fused_dropout(c.p, numel_of(c.shape), "scaled_masked_softmax", gen);

    const SmForward gpu = run_sm_forward(kGpu, c, x, mask, d);
    const SmForward cpu = run_sm_forward(kCpu, c, x, mask, d);
    const RefTensor keep = reference::dropout_mask(c.shape, c.p, d.state);
    const RefTensor* kp = d.active() ? &keep : nullptr;
    if (d.active()) {
      EXPECT_TRUE(same_values(gpu.keep, ref(cpu.keep))) << "keep vs CPU";
      EXPECT_TRUE(same_values(gpu.keep, keep)) << "keep vs reference";
    }
    const RefTensor rx = ref(x);
    const RefTensor rm = mask.defined() ? ref(mask) : RefTensor();
    const RefTensor* pm = mask.defined() ? &rm : nullptr;
    const double ytol = loosest({c.y_dt, cd});
    EXPECT_TRUE(all_close(gpu.y, reference::scaled_masked_softmax(rx, pm, c.scale, kp, c.p), ytol, ytol * 1e-2))
        << "y";
    EXPECT_TRUE(all_close(gpu.y, cpu.y, ytol, ytol * 1e-2)) << "y vs CPU";
    const double ctol = tolerance(cd);
    EXPECT_TRUE(all_close(gpu.stats, reference_softmax_stats(rx, pm, c.scale), 4 * ctol, 4 * ctol)) << "stats";
    EXPECT_TRUE(all_close(gpu.stats, cpu.stats, 4 * ctol, 4 * ctol)) << "stats vs CPU";

    // backward, from each device's own saved statistics; out_scale 1 or the forward's scale
    const double out_scale = variant++ % 2 ? 1.0 : c.scale;
    const Tensor g = random_tensor(c.shape, cd == DType::f64 ? DType::f64 : c.y_dt);
    auto run_backward = [&](Device dev, const SmForward& f) {
      const Tensor dx = full(c.shape, kNaN, {c.x_dt, dev});
      native::scaled_masked_softmax_backward_stub.call(dev, "scaled_masked_softmax_backward")(
          dx, g.to(dev), x.to(dev), mask_on(c, mask, dev), f.stats, f.keep, c.scale, out_scale, d.scale);
      return dx;
    };
    const Tensor dg = run_backward(kGpu, gpu), dc = run_backward(kCpu, cpu);
    RefTensor want = reference::scaled_masked_softmax_backward(ref(g), rx, pm, c.scale, kp, c.p);
    for (double& v : want.data) v *= out_scale / c.scale;
    const double gtol = std::max(grad_tol(c.x_dt), grad_tol(cd));
    EXPECT_TRUE(all_close(dg, want, gtol, gtol)) << "dx";
    EXPECT_TRUE(all_close(dg, dc, gtol, gtol)) << "dx vs CPU";
  }
}

TEST(CudaScaledMaskedSoftmax, FullyMaskedRowsDoWhatTheCpuDoes) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (int64_t len : {int64_t(40), int64_t(1500)}) {
    for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
      for (double p : {0.0, 0.3}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " rows of " + std::to_string(len) + " p " + std::to_string(p));
        const SmCase c{{4, len}, {4, len}, dt, dt, dt, 0.5, p};
        const Tensor x = random_tensor(c.shape, dt, false, -4.0, 4.0);
        RefTensor rm = ref(random_tensor(c.shape, dt, false, -3.0, 0.0));
        for (int64_t j = 0; j < len; ++j) rm.data[size_t(len + j)] = -kInf;  // row 1 masked everywhere
        const Tensor mask = reference::to_tensor(rm, dt);
        Generator gen;
    gen.set_state(random_state());
        const native::FusedDropout d = native::make_fused_dropout(p, 4 * len, "scaled_masked_softmax", gen);
        const SmForward gpu = run_sm_forward(kGpu, c, x, mask, d);
        const SmForward cpu = run_sm_forward(kCpu, c, x, mask, d);
        // NaN positions must match exactly; the other rows agree to rounding
        const double tol = tolerance(dt);
        EXPECT_TRUE(all_close(gpu.y, cpu.y, tol, tol * 1e-2)) << "y";
        EXPECT_TRUE(all_close(gpu.stats, cpu.stats, 4 * tol, 4 * tol)) << "stats";
        const std::vector<double> st = gpu.stats.to(kCpu).to(DType::f64).to_vector<double>();
        EXPECT_EQ(st[2], -kInf) << "the masked row's max";
        if (d.active()) {
          EXPECT_TRUE(same_values(gpu.keep, ref(cpu.keep))) << "keep";
        }
        const Tensor g = random_tensor(c.shape, dt);
        const Tensor dg = full(c.shape, kNaN, {dt, kGpu}), dc = full(c.shape, kNaN, {dt, kCpu});
        native::scaled_masked_softmax_backward_stub.call(kGpu, "scaled_masked_softmax_backward")(
            dg, g.to(kGpu), x.to(kGpu), mask.to(kGpu), gpu.stats, gpu.keep, 0.5, 0.5, d.scale);
        native::scaled_masked_softmax_backward_stub.call(kCpu, "scaled_masked_softmax_backward")(
            dc, g, x, mask, cpu.stats, cpu.keep, 0.5, 0.5, d.scale);
        EXPECT_TRUE(all_close(dg, dc, 2 * tol, 2 * tol)) << "dx";
      }
    }
  }
}

TEST(CudaScaledMaskedSoftmax, PublicOpMatchesCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  struct Case {
    Shape shape, mask;
    DType x_dt, mask_dt, out_dt;
    double p;
  };
  const std::vector<Case> cases = {
      {{2, 3, 7, 40}, {2, 1, 1, 40}, DType::bf16, DType::f32, DType::f32, 0.1},
      {{2, 2, 5, 1030}, {2, 1, 5, 1030}, DType::f32, DType::f64, DType::f32, 0.2},  // f64 mask: f64 compute
      {{3, 9, 9}, {9}, DType::f16, DType::f16, DType::f16, 0.0},
      {{4, 33}, {}, DType::f32, DType::f32, DType::bf16, 0.3},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("scaled_masked_softmax " + shape_str(c.shape) + " mask " + shape_str(c.mask) + " x " +
                 dtype_name(c.x_dt) + " out " + dtype_name(c.out_dt));
    const Tensor x = random_tensor(c.shape, c.x_dt, false, -3.0, 3.0);
    const Tensor mask = c.mask.empty() ? Tensor() : random_tensor(c.mask, c.mask_dt, false, -5.0, 0.0);
    const GeneratorState st = random_state();
    Generator gen_gpu, gen_cpu;
    gen_gpu.set_state(st);
    gen_cpu.set_state(st);
    const double scale = 0.3;
    const native::ScaledMaskedSoftmaxResult fg =
        native::scaled_masked_softmax(x.to(kGpu), on(mask, kGpu), scale, c.p, c.out_dt, gen_gpu);
    const native::ScaledMaskedSoftmaxResult fc = native::scaled_masked_softmax(x, mask, scale, c.p, c.out_dt, gen_cpu);
    ASSERT_EQ(fg.y.device(), kGpu);
    const DType cd = fc.saved.stats.dtype();
    const double tol = loosest({c.out_dt, cd});
    EXPECT_TRUE(all_close(fg.y, fc.y, tol, tol * 1e-2)) << "y";
    EXPECT_TRUE(all_close(fg.saved.stats, fc.saved.stats, 4 * tolerance(cd), 4 * tolerance(cd))) << "stats";
    ASSERT_EQ(fg.saved.keep.defined(), c.p > 0);
    if (c.p > 0) {
      EXPECT_TRUE(same_values(fg.saved.keep, ref(fc.saved.keep))) << "keep";
    }
    const Tensor g = random_tensor(c.shape, c.out_dt);
    const double ds = c.p > 0 ? 1.0 / (1.0 - c.p) : 1.0;
    const Tensor dg = native::scaled_masked_softmax_backward(g.to(kGpu), fg.saved, scale, scale, ds);
    const Tensor dc = native::scaled_masked_softmax_backward(g, fc.saved, scale, scale, ds);
    const double gtol = std::max(grad_tol(fc.saved.x.dtype()), grad_tol(c.out_dt));
    EXPECT_TRUE(all_close(dg, dc, gtol, gtol)) << "dx";
  }
}

TEST(CudaScaledMaskedSoftmax, IntegerInputRaises) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Tensor xi = zeros({2, 4}, {DType::i32, kGpu});
  const Tensor y = zeros({2, 4}, {DType::f32, kGpu}), st = zeros({2, 2}, {DType::f32, kGpu});
  EXPECT_EMBER_ERROR(native::scaled_masked_softmax_stub.call(kGpu, "scaled_masked_softmax")(
                         y, st, Tensor(), xi, Tensor(), 1.0, native::FusedDropout{}),
                     "scaled_masked_softmax", "input", "floating point", "int32");
}

// dweight, dbias and dx_bias of the residual + layer norm are summed over chunks of 128 rows
// (the chunks on grid.y, whose 65535 cap makes blocks take several), then chunk by chunk in
// order: over many chunks the same bits on a second run, and past the cap every row counts.
TEST(CudaAddLayerNorm, ColumnSumsOverManyRowChunks) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const auto column_sums = [](const Tensor& g, const Tensor& h, const Tensor& mean, const Tensor& rstd,
                              const Tensor& w) {
    const int64_t cols = h.shape()[1];
    std::vector<Tensor> out;  // dx_bias, dweight, dbias
    for (int k = 0; k < 3; ++k) out.push_back(full({cols}, kNaN, {DType::f32, kGpu}));
    native::add_layer_norm_backward_stub.call(kGpu, "add_layer_norm_backward")(
        Tensor(), Tensor(), out[0], out[1], out[2], g, h, mean, rstd, w, Tensor(), 1.0);
    return out;
  };
  {
    const int64_t rows = 5000, cols = 768;
    const Tensor h = random_tensor({rows, cols}, DType::f32, false, -2.0, 2.0).to(kGpu);
    const Tensor g = random_tensor({rows, cols}, DType::bf16).to(kGpu);
    const Tensor mean = random_tensor({rows}, DType::f32, false, -0.1, 0.1).to(kGpu);
    const Tensor rstd = random_tensor({rows}, DType::f32, false, 0.5, 2.0).to(kGpu);
    const Tensor w = random_tensor({cols}).to(kGpu);
    const std::vector<Tensor> first = column_sums(g, h, mean, rstd, w), second = column_sums(g, h, mean, rstd, w);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(first[size_t(k)].to_vector<float>(), second[size_t(k)].to_vector<float>()) << "output " << k;
      EXPECT_EQ(sum(ne(first[size_t(k)], first[size_t(k)])).item<int64_t>(), 0) << "output " << k << " has NaN";
    }
  }
  // Every row is h = [0, 1, 2, 3] (mean 1.5, rstd r) with gradient [1, 0, 0, 0] on the first
  // 128 rows and the last 300, zero elsewhere: each sum is 428 times one row's value.
  const int64_t rows = 65535 * 128 + 300, cols = 4, tail = 300;
  const double eps = 1e-5, r = double(float(1.0 / std::sqrt(1.25 + eps)));
  const Tensor h = zeros({rows, cols}, {DType::f32, kGpu});
  for (int64_t j = 1; j < cols; ++j) h.narrow(1, j, 1).fill_(double(j));
  const Tensor g = zeros({rows, cols}, {DType::f32, kGpu});
  g.narrow(0, 0, 128).narrow(1, 0, 1).fill_(1.0);
  g.narrow(0, rows - tail, tail).narrow(1, 0, 1).fill_(1.0);
  const std::vector<Tensor> got = column_sums(g, h, full({rows}, 1.5, {DType::f32, kGpu}),
                                              full({rows}, r, {DType::f32, kGpu}), Tensor());
  const double n = 128.0 + double(tail);
  const double xhat0 = -1.5 * r, a = 0.25, c = xhat0 / 4;  // a = mean(g), c = mean(g xhat)
  for (int64_t j = 0; j < cols; ++j) {
    SCOPED_TRACE("column " + std::to_string(j));
    const double gj = j == 0 ? 1.0 : 0.0, xhat = (double(j) - 1.5) * r;
    EXPECT_NEAR(got[0].to_vector<double>()[size_t(j)], n * r * (gj - a - xhat * c), 1e-3) << "dx_bias";
    EXPECT_NEAR(got[1].to_vector<double>()[size_t(j)], n * gj * xhat, 1e-3) << "dweight";
    EXPECT_EQ(got[2].to_vector<double>()[size_t(j)], n * gj) << "dbias";
  }
}
