// CUDA kernels of the unary elementwise ops and their backward, loss unscaling, and the fused
// Adam/AdamW and SGD steps. Forward results are checked against the double reference, backward
// results and optimizer steps against the CPU kernels fed the same values. Outputs start out
// poisoned so that an unwritten element shows, and strided outputs leave their gaps untouched.
// Every test skips without a CUDA device.
#include <cmath>
#include <limits>
#include <string>

#include "core/device_api.h"
#include "core/native/amp.h"
#include "core/native/elementwise.h"
#include "core/native/fused_optim.h"
#include "kernels/reference/amp.h"
#include "kernels/reference/elementwise.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_tensor;
using ember::testing::tolerance;
using ember::testing::uniform_int;
using native::UnaryOp;
using native::UnaryParams;

namespace {

const Device kGpu = Device::cuda(0);
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// Contiguous: the vectorised path. Strided: every other column of a wider buffer, or a
// transposed view. Misaligned: contiguous but one element past a 16-byte boundary.
enum class Layout { Contiguous, Strided, Misaligned };
const Layout kLayouts[] = {Layout::Contiguous, Layout::Strided, Layout::Misaligned};

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::Contiguous: return "contiguous";
    case Layout::Strided: return "strided";
    case Layout::Misaligned: return "misaligned";
  }
  return "?";
}

// A device copy of the 2-D host tensor x in layout l.
Tensor device_input(const Tensor& x, Layout l) {
  switch (l) {
    case Layout::Contiguous: return x.to(kGpu);
    case Layout::Strided: return x.t().contiguous().to(kGpu).t();
    case Layout::Misaligned: {
      Tensor base = zeros({x.numel() + 1}, {x.dtype(), kGpu});
      Tensor v = base.slice(0, 1, x.numel() + 1).view(x.shape());
      v.copy_(x.to(kGpu));
      return v;
    }
  }
  return Tensor();
}

// A 2-D device output of `shape` filled with `poison`, and the elements of its buffer that lie
// outside it (undefined when there are none).
struct Poisoned {
  Tensor out;
  Tensor gaps;
};

Poisoned poisoned_output(const Shape& shape, DType dt, Layout l, double poison) {
  const int64_t r = shape[0], c = shape[1];
  switch (l) {
    case Layout::Contiguous: return {full(shape, poison, {dt, kGpu}), Tensor()};
    case Layout::Strided: {
      const Tensor parent = full({r, 2 * c}, poison, {dt, kGpu});
      return {parent.slice(1, 0, 2 * c, 2), parent.slice(1, 1, 2 * c, 2)};
    }
    case Layout::Misaligned: {
      const Tensor parent = full({r * c + 1}, poison, {dt, kGpu});
      return {parent.slice(0, 1, r * c + 1).view(shape), parent.slice(0, 0, 1)};
    }
  }
  return {};
}

// Every element equals `value` (NaN matches NaN).
::testing::AssertionResult all_equal_to(const Tensor& t, double value) {
  if (!t.defined()) return ::testing::AssertionSuccess();
  const std::vector<double> v = t.to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i) {
    const bool same = std::isnan(value) ? std::isnan(v[i]) : v[i] == value;
    if (!same) return ::testing::AssertionFailure() << "element " << i << " is " << v[i] << ", expected " << value;
  }
  return ::testing::AssertionSuccess();
}

Shape random_matrix_shape() {
  // mostly small, sometimes large enough for many blocks of the grid-stride loops
  if (uniform_int(0, 3) == 0) return {uniform_int(100, 300), uniform_int(100, 300)};
  return {uniform_int(1, 40), uniform_int(1, 70)};
}

struct UnaryCase {
  UnaryOp op;
  UnaryParams p;
  double lo, hi;            // input range
  const char* derivative;   // name for reference::unary_derivative
  std::string label;
};

std::vector<UnaryCase> unary_cases() {
  return {
      {UnaryOp::Neg, {}, -2, 2, "neg", "neg"},
      {UnaryOp::Exp, {}, -3, 3, "exp", "exp"},
      {UnaryOp::Log, {}, 0.1, 4, "log", "log"},
      {UnaryOp::Sqrt, {}, 0.1, 4, "sqrt", "sqrt"},
      {UnaryOp::Rsqrt, {}, 0.1, 4, "rsqrt", "rsqrt"},
      {UnaryOp::Tanh, {}, -3, 3, "tanh", "tanh"},
      {UnaryOp::Sigmoid, {}, -6, 6, "sigmoid", "sigmoid"},
      {UnaryOp::Relu, {}, -2, 2, "relu", "relu"},
      {UnaryOp::LeakyRelu, {0.2, 0}, -2, 2, "leaky_relu", "leaky_relu 0.2"},
      {UnaryOp::LeakyRelu, {-1.5, 0}, -2, 2, "leaky_relu", "leaky_relu -1.5"},
      {UnaryOp::Gelu, {}, -4, 4, "gelu", "gelu"},
      {UnaryOp::GeluTanh, {}, -4, 4, "gelu_tanh", "gelu_tanh"},
      {UnaryOp::Silu, {}, -6, 6, "silu", "silu"},
      {UnaryOp::Abs, {}, -2, 2, "abs", "abs"},
      {UnaryOp::PowScalar, {2.5, 0}, 0.1, 3, "pow", "pow 2.5"},
      {UnaryOp::PowScalar, {-1.5, 0}, 0.2, 3, "pow", "pow -1.5"},
      {UnaryOp::PowScalar, {2.0, 0}, -2, 2, "pow", "pow 2"},
      {UnaryOp::PowScalar, {1.0, 0}, -2, 2, "pow", "pow 1"},
      {UnaryOp::Clamp, {-0.5, 0.75}, -2, 2, "clamp", "clamp [-0.5, 0.75]"},
      {UnaryOp::Clamp, {-kInf, 0.25}, -2, 2, "clamp", "clamp max 0.25"},
      {UnaryOp::Clamp, {0.5, -0.25}, -2, 2, "clamp", "clamp with lower > upper"},
  };
}

reference::RefTensor ref_unary(const UnaryCase& k, const reference::RefTensor& x) {
  switch (k.op) {
    case UnaryOp::Neg: return reference::neg(x);
    case UnaryOp::Exp: return reference::exp(x);
    case UnaryOp::Log: return reference::log(x);
    case UnaryOp::Sqrt: return reference::sqrt(x);
    case UnaryOp::Rsqrt: return reference::rsqrt(x);
    case UnaryOp::Tanh: return reference::tanh(x);
    case UnaryOp::Sigmoid: return reference::sigmoid(x);
    case UnaryOp::Relu: return reference::relu(x);
    case UnaryOp::LeakyRelu: return reference::leaky_relu(x, k.p.a);
    case UnaryOp::Gelu: return reference::gelu(x, false);
    case UnaryOp::GeluTanh: return reference::gelu(x, true);
    case UnaryOp::Silu: return reference::silu(x);
    case UnaryOp::Abs: return reference::abs(x);
    case UnaryOp::PowScalar: return reference::pow(x, k.p.a);
    case UnaryOp::Clamp: return reference::clamp(x, k.p.a, k.p.b);
  }
  return {};
}

void run_unary_gpu(const UnaryCase& k, const Tensor& out, const Tensor& x) {
  native::unary_stub.call(kGpu, native::op_name(k.op))(k.op, out, x, k.p);
}

void run_unary_backward_gpu(const UnaryCase& k, const Tensor& gi, const Tensor& go, const Tensor& saved) {
  native::unary_backward_stub.call(kGpu, native::op_name(k.op))(k.op, gi, go, saved, k.p);
}

}  // namespace

TEST(CudaUnary, ForwardMatchesReferenceInEveryLayout) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (const UnaryCase& k : unary_cases()) {
    for (DType dt : ember::testing::kFloatTypes) {
      for (Layout in_layout : kLayouts) {
        for (Layout out_layout : kLayouts) {
          const Shape shape = random_matrix_shape();
          SCOPED_TRACE(k.label + " " + dtype_name(dt) + " " + shape_str(shape) + " in " + layout_name(in_layout) +
                       ", out " + layout_name(out_layout));
          const Tensor x = random_tensor(shape, dt, false, k.lo, k.hi);
          const Poisoned o = poisoned_output(shape, dt, out_layout, kNaN);
          run_unary_gpu(k, o.out, device_input(x, in_layout));
          const double tol = tolerance(dt);
          EXPECT_TRUE(all_close(o.out, ref_unary(k, reference::from_tensor(x)), tol, tol));
          EXPECT_TRUE(all_equal_to(o.gaps, kNaN)) << "an element outside the output was written";
        }
      }
    }
  }
}

TEST(CudaUnary, NaNPassesThroughReluLeakyReluAndClamp) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : ember::testing::kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = full({3, 17}, kNaN, {dt, kGpu});
    for (const UnaryCase& k : {UnaryCase{UnaryOp::Relu, {}, 0, 0, "relu", "relu"},
                               UnaryCase{UnaryOp::LeakyRelu, {0.1, 0}, 0, 0, "leaky_relu", "leaky_relu"},
                               UnaryCase{UnaryOp::Clamp, {-1, 1}, 0, 0, "clamp", "clamp"}}) {
      const Poisoned o = poisoned_output({3, 17}, dt, Layout::Contiguous, 5.0);
      run_unary_gpu(k, o.out, x);
      EXPECT_TRUE(all_equal_to(o.out, kNaN)) << k.label;
    }
  }
}

TEST(CudaUnary, IntegerOpsMatchTheCpuExactly) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const double poison = 12345.0;  // outside every result below
  const std::vector<UnaryCase> cases = {
      {UnaryOp::Neg, {}, -50, 50, "neg", "neg"},
      {UnaryOp::Abs, {}, -50, 50, "abs", "abs"},
      {UnaryOp::Relu, {}, -50, 50, "relu", "relu"},
      {UnaryOp::Clamp, {-10.5, 20.2}, -50, 50, "clamp", "clamp [-10.5, 20.2]"},
      {UnaryOp::Clamp, {-1e30, 1e30}, -50, 50, "clamp", "clamp with bounds beyond the type"},
  };
  for (const UnaryCase& k : cases) {
    for (DType dt : {DType::i32, DType::i64}) {
      for (Layout l : kLayouts) {
        const Shape shape = random_matrix_shape();
        SCOPED_TRACE(k.label + " " + dtype_name(dt) + " " + shape_str(shape) + " " + layout_name(l));
        const Tensor x = random_tensor(shape, dt, false, k.lo, k.hi);
        const Tensor expected = native::unary(k.op, x, k.p);
        const Poisoned o = poisoned_output(shape, dt, l, poison);
        run_unary_gpu(k, o.out, device_input(x, l));
        EXPECT_TRUE(all_close(o.out, expected, 0.0, 0.0));
        EXPECT_TRUE(all_equal_to(o.gaps, poison));
      }
    }
  }
}

TEST(CudaUnary, UnsupportedDtypesRaise) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Tensor xi = zeros({4}, {DType::i32, kGpu});
  const Tensor oi = zeros({4}, {DType::i32, kGpu});
  EXPECT_EMBER_ERROR(native::unary_stub.call(kGpu, "exp")(UnaryOp::Exp, oi, xi, {}), "exp", "not supported", "int32");
  const Tensor xb = zeros({4}, {DType::boolean, kGpu});
  EXPECT_EMBER_ERROR(native::unary_stub.call(kGpu, "neg")(UnaryOp::Neg, xb, xb, {}), "neg", "bool");
  EXPECT_EMBER_ERROR(native::unary_backward_stub.call(kGpu, "relu")(UnaryOp::Relu, oi, oi, oi, {}), "relu",
                     "floating-point");
}

TEST(CudaUnary, BackwardMatchesTheCpuKernelInEveryLayout) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (const UnaryCase& k : unary_cases()) {
    for (DType dt : ember::testing::kFloatTypes) {
      for (Layout in_layout : kLayouts) {
        for (Layout out_layout : kLayouts) {
          const Shape shape = random_matrix_shape();
          SCOPED_TRACE(k.label + " " + dtype_name(dt) + " " + shape_str(shape) + " in " + layout_name(in_layout) +
                       ", out " + layout_name(out_layout));
          const Tensor x = random_tensor(shape, dt, false, k.lo, k.hi);
          const Tensor g = random_tensor(shape, dt);
          const Tensor saved = native::backward_uses_output(k.op) ? native::unary(k.op, x, k.p) : x;
          const Tensor expected = native::unary_backward(k.op, g, saved, k.p);
          const Poisoned o = poisoned_output(shape, dt, out_layout, kNaN);
          run_unary_backward_gpu(k, o.out, device_input(g, in_layout), device_input(saved, in_layout));
          const double tol = tolerance(dt);
          EXPECT_TRUE(all_close(o.out, expected, tol, tol));
          EXPECT_TRUE(all_equal_to(o.gaps, kNaN)) << "an element outside the gradient was written";
          if (dt == DType::f64) {
            // in double the saved output is exact enough to check against the derivative itself
            reference::RefTensor want = reference::unary_derivative(k.derivative, reference::from_tensor(x), k.p.a,
                                                                    k.p.b);
            const reference::RefTensor rg = reference::from_tensor(g);
            for (size_t i = 0; i < want.data.size(); ++i) want.data[i] *= rg.data[i];
            EXPECT_TRUE(all_close(o.out, want, 1e-9, 1e-9));
          }
        }
      }
    }
  }
}

namespace {

// A value of dt that overflows dt when multiplied by 4.
double overflowing_value(DType dt) {
  switch (dt) {
    case DType::f16: return 60000.0;
    case DType::f64: return 1e308;
    default: return 3e38;
  }
}

}  // namespace

TEST(CudaAmpUnscale, UnscalesInPlaceAndRaisesTheFlagOnlyForNonFiniteResults) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  enum class Bad { None, Inf, NaN, Overflow };
  for (DType dt : ember::testing::kFloatTypes) {
    for (Layout l : kLayouts) {
      for (Bad bad : {Bad::None, Bad::Inf, Bad::NaN, Bad::Overflow}) {
        const Shape shape = random_matrix_shape();
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(shape) + " " + layout_name(l) + " case " +
                     std::to_string(int(bad)));
        const double inv_scale = bad == Bad::Overflow ? 4.0 : 1.0 / 1024.0;
        Tensor host = random_tensor(shape, dt, false, -3000.0, 3000.0);
        const int64_t at = uniform_int(0, host.numel() - 1);
        Tensor slot = host.flatten().select(0, at);
        if (bad == Bad::Inf) slot.fill_(at % 2 ? kInf : -kInf);
        if (bad == Bad::NaN) slot.fill_(kNaN);
        if (bad == Bad::Overflow) slot.fill_(overflowing_value(dt));
        reference::UnscaleResult want = reference::amp_unscale(reference::from_tensor(host), inv_scale, dt);
        ASSERT_EQ(want.found_inf, bad != Bad::None);
        // the reference keeps the overflowing product in double; stored in dt it is +inf
        if (bad == Bad::Overflow) want.grad.data[size_t(at)] = kInf;

        // the gradient sits in a NaN-poisoned buffer: the gaps must stay NaN and not raise the flag
        Poisoned o = poisoned_output(shape, dt, l, kNaN);
        o.out.copy_(host.to(kGpu));
        const Tensor found_inf = zeros({1}, {DType::f32, kGpu});
        native::amp_unscale_(o.out, found_inf, inv_scale);
        // the product by a power of two is exact but for f16 subnormals, hence the small atol
        EXPECT_TRUE(all_close(o.out, want.grad, tolerance(dt), 1e-6));
        EXPECT_EQ(found_inf.item<double>(), want.found_inf ? 1.0 : 0.0);
        EXPECT_TRUE(all_equal_to(o.gaps, kNaN));

        // the flag is never cleared
        const Tensor raised = full({1}, 1.0, {DType::f32, kGpu});
        native::amp_unscale_(random_tensor(shape, dt).to(kGpu), raised, inv_scale);
        EXPECT_EQ(raised.item<double>(), 1.0);
      }
    }
  }
}

TEST(CudaAmpUnscale, TransposedGradient) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : ember::testing::kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor host = random_tensor({37, 21}, dt);
    const Tensor g = host.to(kGpu).t();
    const reference::UnscaleResult want = reference::amp_unscale(reference::from_tensor(host.t()), 0.125, dt);
    const Tensor found_inf = zeros({1}, {DType::f32, kGpu});
    native::amp_unscale_(g, found_inf, 0.125);
    EXPECT_TRUE(all_close(g, want.grad, tolerance(dt), 1e-6));
    EXPECT_EQ(found_inf.item<double>(), 0.0);
  }
}

namespace {

// Runs `steps` updates on CPU copies and device copies of the same state and compares them.
void check_adam_against_cpu(DType param_dt, DType grad_dt, bool decoupled, double grad_scale, int64_t n) {
  const Tensor p0 = random_tensor({n}, param_dt);
  const Tensor m0 = random_tensor({n}, param_dt, false, -0.5, 0.5);
  const Tensor v0 = random_tensor({n}, param_dt, false, 0.0, 0.5);
  Tensor pc = p0.clone(), mc = m0.clone(), vc = v0.clone();
  Tensor pg = p0.clone().to(kGpu), mg = m0.clone().to(kGpu), vg = v0.clone().to(kGpu);
  native::AdamStepArgs args{};
  args.lr = 1e-2;
  args.beta1 = 0.9;
  args.beta2 = 0.999;
  args.eps = 1e-8;
  args.weight_decay = 0.05;
  args.decoupled = decoupled;
  args.grad_scale = grad_scale;
  for (int step = 1; step <= 3; ++step) {
    const Tensor g = random_tensor({n}, grad_dt, false, -1.0, 1.0);
    args.bias_correction1 = 1.0 - std::pow(args.beta1, step);
    args.bias_correction2 = 1.0 - std::pow(args.beta2, step);
    native::adam_step(pc, g, mc, vc, args);
    native::adam_step(pg, g.to(kGpu), mg, vg, args);
  }
  // f32 loses a few ulps to contraction into fused multiply-adds; f64 far fewer
  const double tol = param_dt == DType::f64 ? 1e-12 : 1e-5;
  EXPECT_TRUE(all_close(pg, pc, tol, tol)) << "param";
  EXPECT_TRUE(all_close(mg, mc, tol, tol)) << "exp_avg";
  EXPECT_TRUE(all_close(vg, vc, tol, tol)) << "exp_avg_sq";
  // the step changed the parameters
  EXPECT_FALSE(all_close(pg, p0, 0.0, 0.0));
}

}  // namespace

TEST(CudaFusedOptim, AdamAndAdamWMatchTheCpuStep) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (DType param_dt : {DType::f32, DType::f64}) {
    for (DType grad_dt : ember::testing::kFloatTypes) {
      for (bool decoupled : {true, false}) {
        for (double grad_scale : {1.0, 0.25}) {
          const int64_t n = uniform_int(1, 5000);
          SCOPED_TRACE(std::string(dtype_name(param_dt)) + " params, " + dtype_name(grad_dt) + " grads, " +
                       (decoupled ? "AdamW" : "Adam") + ", grad_scale " + std::to_string(grad_scale) + ", n " +
                       std::to_string(n));
          check_adam_against_cpu(param_dt, grad_dt, decoupled, grad_scale, n);
        }
      }
    }
  }
}

TEST(CudaFusedOptim, SgdMatchesTheCpuStep) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  for (DType param_dt : {DType::f32, DType::f64}) {
    for (DType grad_dt : ember::testing::kFloatTypes) {
      for (double momentum : {0.0, 0.9}) {
        for (bool nesterov : {false, true}) {
          if (nesterov && momentum == 0.0) continue;
          const int64_t n = uniform_int(1, 5000);
          SCOPED_TRACE(std::string(dtype_name(param_dt)) + " params, " + dtype_name(grad_dt) + " grads, momentum " +
                       std::to_string(momentum) + (nesterov ? ", nesterov" : "") + ", n " + std::to_string(n));
          const Tensor p0 = random_tensor({n}, param_dt);
          Tensor pc = p0.clone(), pg = p0.to(kGpu);
          Tensor bc, bg;
          if (momentum != 0.0) {
            bc = zeros({n}, {param_dt});
            bg = zeros({n}, {param_dt, kGpu});
          }
          for (int step = 0; step < 3; ++step) {
            const Tensor g = random_tensor({n}, grad_dt);
            native::SgdStepArgs args{};
            args.lr = 0.05;
            args.momentum = momentum;
            args.dampening = 0.1;
            args.weight_decay = 0.01;
            args.nesterov = nesterov;
            args.first_step = step == 0;
            native::sgd_step(pc, g, bc, args);
            native::sgd_step(pg, g.to(kGpu), bg, args);
          }
          const double tol = param_dt == DType::f64 ? 1e-12 : 1e-5;
          EXPECT_TRUE(all_close(pg, pc, tol, tol)) << "param";
          if (momentum != 0.0) {
            EXPECT_TRUE(all_close(bg, bc, tol, tol)) << "momentum buffer";
          }
        }
      }
    }
  }
}
