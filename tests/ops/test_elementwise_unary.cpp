// One-operand elementwise ops: forward and fused backward against the double reference in every
// dtype and memory layout, gradcheck in float64, known values, NaN handling, errors.
#include <cmath>
#include <functional>

#include "kernels/reference/elementwise.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::kFloatTypes;
using ember::testing::random_shape;
using ember::testing::random_tensor;
using ember::testing::tolerance;
using reference::RefTensor;

namespace {

struct UnaryCase {
  const char* name;       // also the reference::unary_derivative key
  std::function<Tensor(const Tensor&)> op;
  std::function<RefTensor(const RefTensor&)> ref;
  double lo = -3.0, hi = 3.0;  // input range (inside the op's domain)
  double p0 = 0.0, p1 = 0.0;   // pow exponent / clamp bounds / leaky_relu slope, for the derivative
  bool differentiable = true;
};

std::vector<UnaryCase> cases() {
  const double inf = INFINITY;
  return {
      {"neg", [](auto& x) { return neg(x); }, [](auto& x) { return reference::neg(x); }},
      {"exp", [](auto& x) { return exp(x); }, [](auto& x) { return reference::exp(x); }},
      {"log", [](auto& x) { return log(x); }, [](auto& x) { return reference::log(x); }, 0.1, 4.0},
      {"sqrt", [](auto& x) { return sqrt(x); }, [](auto& x) { return reference::sqrt(x); }, 0.1, 4.0},
      {"rsqrt", [](auto& x) { return rsqrt(x); }, [](auto& x) { return reference::rsqrt(x); }, 0.1, 4.0},
      {"tanh", [](auto& x) { return tanh(x); }, [](auto& x) { return reference::tanh(x); }},
      {"sigmoid", [](auto& x) { return sigmoid(x); }, [](auto& x) { return reference::sigmoid(x); }},
      {"silu", [](auto& x) { return silu(x); }, [](auto& x) { return reference::silu(x); }, -6.0, 6.0},
      {"relu", [](auto& x) { return relu(x); }, [](auto& x) { return reference::relu(x); }},
      {"leaky_relu", [](auto& x) { return leaky_relu(x); }, [](auto& x) { return reference::leaky_relu(x, 0.01); },
       -3.0, 3.0, 0.01},
      {"leaky_relu", [](auto& x) { return leaky_relu(x, 0.2); },
       [](auto& x) { return reference::leaky_relu(x, 0.2); }, -3.0, 3.0, 0.2},
      {"leaky_relu", [](auto& x) { return leaky_relu(x, -1.5); },  // a negative slope is allowed, as in PyTorch
       [](auto& x) { return reference::leaky_relu(x, -1.5); }, -3.0, 3.0, -1.5},
      {"gelu", [](auto& x) { return gelu(x); }, [](auto& x) { return reference::gelu(x, false); }, -5.0, 5.0},
      {"gelu_tanh", [](auto& x) { return gelu(x, true); }, [](auto& x) { return reference::gelu(x, true); }, -5.0, 5.0},
      {"abs", [](auto& x) { return abs(x); }, [](auto& x) { return reference::abs(x); }},
      {"pow", [](auto& x) { return pow(x, 2.0); }, [](auto& x) { return reference::pow(x, 2.0); }, -3.0, 3.0, 2.0},
      {"pow", [](auto& x) { return pow(x, 3.0); }, [](auto& x) { return reference::pow(x, 3.0); }, -2.0, 2.0, 3.0},
      {"pow", [](auto& x) { return pow(x, -1.5); }, [](auto& x) { return reference::pow(x, -1.5); }, 0.2, 3.0, -1.5},
      {"pow", [](auto& x) { return pow(x, 0.5); }, [](auto& x) { return reference::pow(x, 0.5); }, 0.2, 3.0, 0.5},
      {"pow", [](auto& x) { return pow(x, 0.0); }, [](auto& x) { return reference::pow(x, 0.0); }, -3.0, 3.0, 0.0},
      {"clamp", [](auto& x) { return clamp(x, -1.0, 0.5); }, [](auto& x) { return reference::clamp(x, -1.0, 0.5); },
       -3.0, 3.0, -1.0, 0.5},
      {"clamp", [](auto& x) { return clamp(x, -0.5, std::nullopt); },
       [inf](auto& x) { return reference::clamp(x, -0.5, inf); }, -3.0, 3.0, -0.5, inf},
      {"clamp", [](auto& x) { return clamp(x, std::nullopt, 1.0); },
       [inf](auto& x) { return reference::clamp(x, -inf, 1.0); }, -3.0, 3.0, -inf, 1.0},
  };
}

// Forward tolerance: the result is rounded once to the output dtype (computation in float or
// double); a few ulps of float for f32 transcendental functions.
double fwd_tol(DType dt) { return tolerance(dt); }

// Backward tolerance: half types save a rounded output (e.g. tanh' = 1 - y^2 from a rounded y),
// so they get an absolute slack of a few units of their precision.
double bwd_atol(DType dt) { return dt == DType::f16 || dt == DType::bf16 ? 8 * tolerance(dt) : tolerance(dt); }

}  // namespace

TEST(ElementwiseUnary, ForwardMatchesReference) {
  for (const UnaryCase& c : cases()) {
    for (DType dt : kFloatTypes) {
      for (int trial = 0; trial < 4; ++trial) {
        const Shape s = random_shape(trial, 6, /*allow_zero=*/trial == 3);
        Tensor x = random_tensor(s, dt, trial % 2 == 1, c.lo, c.hi);
        SCOPED_TRACE(::testing::Message() << c.name << " p " << c.p0 << " " << dt << " " << shape_str(s)
                                          << (trial % 2 ? " strided" : ""));
        Tensor y = c.op(x);
        EXPECT_EQ(y.dtype(), dt);
        EXPECT_TRUE(all_close(y, c.ref(reference::from_tensor(x)), fwd_tol(dt), fwd_tol(dt)));
      }
    }
  }
}

TEST(ElementwiseUnary, LargeAndExpandedInputs) {
  // big enough to be split across threads; expanded (stride 0) and transposed layouts
  for (const UnaryCase& c : cases()) {
    SCOPED_TRACE(::testing::Message() << c.name << " p " << c.p0);
    Tensor x = random_tensor({300, 200}, DType::f32, false, c.lo, c.hi);
    EXPECT_TRUE(all_close(c.op(x), c.ref(reference::from_tensor(x)), 1e-5, 1e-5));
    Tensor xt = x.t();
    EXPECT_TRUE(all_close(c.op(xt), c.ref(reference::from_tensor(xt)), 1e-5, 1e-5));
    Tensor row = random_tensor({1, 7}, DType::f32, false, c.lo, c.hi).expand({5, 7});
    EXPECT_TRUE(all_close(c.op(row), c.ref(reference::from_tensor(row)), 1e-5, 1e-5));
  }
}

TEST(ElementwiseUnary, FusedBackwardMatchesReferenceDerivative) {
  for (const UnaryCase& c : cases()) {
    for (DType dt : kFloatTypes) {
      for (int trial = 0; trial < 3; ++trial) {
        const Shape s = random_shape(trial + 1, 5, trial == 2);
        Tensor x = random_tensor(s, dt, trial == 1, c.lo, c.hi).requires_grad_();
        Tensor g = random_tensor(s, dt, trial == 0);
        SCOPED_TRACE(::testing::Message() << c.name << " p " << c.p0 << " " << dt << " " << shape_str(s));
        c.op(x).backward(g);
        ASSERT_TRUE(x.grad().defined());
        EXPECT_EQ(x.grad().dtype(), dt);
        const RefTensor want = reference::mul(reference::from_tensor(g),
                                              reference::unary_derivative(c.name, reference::from_tensor(x), c.p0, c.p1));
        EXPECT_TRUE(all_close(x.grad(), want, 4 * tolerance(dt), bwd_atol(dt)));
      }
    }
  }
}

TEST(ElementwiseUnary, Gradcheck) {
  for (const UnaryCase& c : cases()) {
    for (int trial = 0; trial < 3; ++trial) {
      const Shape s = random_shape(trial, 4);
      Tensor x = random_tensor(s, DType::f64, trial == 2, c.lo, c.hi).requires_grad_();
      SCOPED_TRACE(::testing::Message() << c.name << " p " << c.p0 << " " << shape_str(s));
      auto r = gradcheck([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{c.op(in[0])}; }, {x});
      EXPECT_TRUE(r.ok) << r.message;
    }
  }
}

TEST(ElementwiseUnary, GradcheckComposites) {
  // chains and methods, including a broadcasting product that reuses an intermediate
  Tensor x = random_tensor({3, 4}, DType::f64, true).requires_grad_();
  Tensor b = random_tensor({4}, DType::f64, false, 0.5, 2.0).requires_grad_();
  auto r = gradcheck(
      [](const std::vector<Tensor>& in) {
        Tensor h = in[0].tanh() * in[1];
        return std::vector<Tensor>{h.sigmoid().exp() + h.gelu(true) - in[1].log() / (in[0].abs() + 1.0) +
                                   in[0].pow(2.0).sqrt().rsqrt().clamp(-1.0, 2.0) + in[0].relu().neg()};
      },
      {x, b});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(ElementwiseUnary, Float32AccuracyAcrossTheRange) {
  // a dense sweep, well past where the functions saturate, against double precision
  Tensor wide = arange(-100.0, 88.0, 0.0137, {DType::f32});
  EXPECT_TRUE(all_close(exp(wide), reference::exp(reference::from_tensor(wide)), 4e-7, 1e-38));
  Tensor x = arange(-30.0, 30.0, 0.00731, {DType::f32});
  const RefTensor rx = reference::from_tensor(x);
  EXPECT_TRUE(all_close(tanh(x), reference::tanh(rx), 4e-7, 0));
  EXPECT_TRUE(all_close(sigmoid(x), reference::sigmoid(rx), 4e-7, 1e-38));
  EXPECT_TRUE(all_close(gelu(x, true), reference::gelu(rx, true), 1e-6, 1e-7));
  EXPECT_TRUE(all_close(gelu(x), reference::gelu(rx, false), 1e-6, 5e-7));
  EXPECT_TRUE(all_close(silu(x), reference::silu(rx), 1e-6, 1e-38));
  Tensor tiny = arange(-1e-3, 1e-3, 1.37e-6, {DType::f32});  // relative accuracy near 0
  EXPECT_TRUE(all_close(tanh(tiny), reference::tanh(reference::from_tensor(tiny)), 4e-7, 0));
  // derivatives over the same sweep
  for (const char* name : {"tanh", "sigmoid", "gelu", "gelu_tanh", "silu", "exp"}) {
    Tensor xs = arange(-20.0, 20.0, 0.0111, {DType::f32}).requires_grad_();
    const std::string n(name);
    Tensor y = n == "tanh" ? tanh(xs) : n == "sigmoid" ? sigmoid(xs) : n == "gelu" ? gelu(xs)
             : n == "gelu_tanh" ? gelu(xs, true) : n == "silu" ? silu(xs) : exp(xs);
    y.backward(ones_like(y));
    SCOPED_TRACE(name);
    EXPECT_TRUE(all_close(xs.grad(), reference::unary_derivative(n, reference::from_tensor(xs)), 2e-6, 1e-6));
  }
}

TEST(ElementwiseUnary, SpecialValues) {
  const float inf = INFINITY;
  Tensor x = from_vector<float>({-inf, -200.0f, 89.0f, 200.0f, inf, NAN, -0.0f});
  const std::vector<float> e = exp(x).to_vector<float>();
  EXPECT_EQ(e[0], 0.0f);
  EXPECT_EQ(e[1], 0.0f);
  EXPECT_EQ(e[2], inf);
  EXPECT_EQ(e[3], inf);
  EXPECT_EQ(e[4], inf);
  EXPECT_TRUE(std::isnan(e[5]));
  EXPECT_EQ(e[6], 1.0f);
  const std::vector<float> t = tanh(x).to_vector<float>();
  EXPECT_EQ(t[0], -1.0f);
  EXPECT_EQ(t[3], 1.0f);
  EXPECT_EQ(t[4], 1.0f);
  EXPECT_TRUE(std::isnan(t[5]));
  EXPECT_EQ(t[6], 0.0f);
  const std::vector<float> s = sigmoid(x).to_vector<float>();
  EXPECT_EQ(s[0], 0.0f);
  EXPECT_EQ(s[4], 1.0f);
  EXPECT_TRUE(std::isnan(s[5]));
  const std::vector<float> g = gelu(x).to_vector<float>(), gt = gelu(x, true).to_vector<float>();
  EXPECT_EQ(g[3], 200.0f);
  EXPECT_EQ(gt[3], 200.0f);
  EXPECT_EQ(g[1], -0.0f);
  EXPECT_TRUE(std::isnan(g[5]));
  EXPECT_TRUE(std::isnan(gt[5]));
  // silu saturates to x above and to -0 below, as x / (1 + exp(-x)) does
  const std::vector<float> si = silu(x).to_vector<float>();
  EXPECT_EQ(si[3], 200.0f);
  EXPECT_EQ(si[4], inf);
  EXPECT_EQ(si[1], 0.0f);
  EXPECT_TRUE(std::signbit(si[1]));
  EXPECT_TRUE(std::isnan(si[5]));
}

TEST(ElementwiseUnary, KnownValues) {
  Tensor x = from_vector<double>({-1.0, 0.0, 1.0, 2.0});
  auto v = [](const Tensor& t) { return t.to_vector<double>(); };
  const std::vector<double> ge = v(gelu(x)), gt = v(gelu(x, true)), sg = v(sigmoid(x));
  // values from the closed forms, as torch.nn.functional.gelu gives them
  EXPECT_NEAR(ge[0], -0.15865525393145707, 1e-15);
  EXPECT_NEAR(ge[2], 0.8413447460685429, 1e-15);
  EXPECT_NEAR(ge[3], 1.9544997361036416, 1e-15);
  EXPECT_NEAR(gt[0], -0.15880800939172324, 1e-15);
  EXPECT_NEAR(gt[2], 0.8411919906082768, 1e-15);
  EXPECT_EQ(ge[1], 0.0);
  EXPECT_EQ(sg[1], 0.5);
  EXPECT_NEAR(sg[2], 0.7310585786300049, 1e-15);
  const std::vector<double> si = v(silu(x));  // x sigmoid(x)
  EXPECT_NEAR(si[0], -0.2689414213699951, 1e-15);
  EXPECT_EQ(si[1], 0.0);
  EXPECT_NEAR(si[2], 0.7310585786300049, 1e-15);
  EXPECT_NEAR(si[3], 1.7615941559557649, 1e-15);
  EXPECT_EQ(v(relu(x)), (std::vector<double>{0.0, 0.0, 1.0, 2.0}));
  EXPECT_EQ(v(leaky_relu(x)), (std::vector<double>{-0.01, 0.0, 1.0, 2.0}));
  EXPECT_EQ(v(leaky_relu(x, 0.5)), (std::vector<double>{-0.5, 0.0, 1.0, 2.0}));
  EXPECT_EQ(v(abs(x)), (std::vector<double>{1.0, 0.0, 1.0, 2.0}));
  EXPECT_EQ(v(clamp(x, 0.5, 1.5)), (std::vector<double>{0.5, 0.5, 1.0, 1.5}));
  EXPECT_EQ(v(clamp(x, 2.0, 1.0)), (std::vector<double>{1.0, 1.0, 1.0, 1.0}));  // min > max gives max
  EXPECT_EQ(v(pow(x, 2.0)), (std::vector<double>{1.0, 0.0, 1.0, 4.0}));
  EXPECT_EQ(v(pow(x, 0.0)), (std::vector<double>{1.0, 1.0, 1.0, 1.0}));
  EXPECT_EQ(v(exp(from_vector<double>({0.0}))), (std::vector<double>{1.0}));
  EXPECT_TRUE(std::isinf(v(log(from_vector<double>({0.0})))[0]));
  // the exact and tanh gelu differ, by at most about 5e-4
  EXPECT_GT(std::abs(ge[0] - gt[0]), 1e-4);
}

TEST(ElementwiseUnary, GradientConventionsAtKinks) {
  auto grad_of = [](const std::function<Tensor(const Tensor&)>& f, std::vector<double> xs) {
    Tensor x = from_vector<double>(xs).requires_grad_();
    f(x).sum().backward();
    return x.grad().to_vector<double>();
  };
  EXPECT_EQ(grad_of([](auto& x) { return relu(x); }, {-1.0, 0.0, 2.0}), (std::vector<double>{0.0, 0.0, 1.0}));
  // leaky_relu takes the slope at 0, as PyTorch does
  EXPECT_EQ(grad_of([](auto& x) { return leaky_relu(x, 0.25); }, {-1.0, 0.0, 2.0}),
            (std::vector<double>{0.25, 0.25, 1.0}));
  EXPECT_EQ(grad_of([](auto& x) { return abs(x); }, {-1.0, 0.0, 2.0}), (std::vector<double>{-1.0, 0.0, 1.0}));
  // clamp passes the gradient on the bounds themselves
  EXPECT_EQ(grad_of([](auto& x) { return clamp(x, -1.0, 1.0); }, {-2.0, -1.0, 0.0, 1.0, 2.0}),
            (std::vector<double>{0.0, 1.0, 1.0, 1.0, 0.0}));
  EXPECT_EQ(grad_of([](auto& x) { return pow(x, 0.0); }, {0.0, 3.0}), (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(grad_of([](auto& x) { return pow(x, 2.0); }, {-1.5, 3.0}), (std::vector<double>{-3.0, 6.0}));
}

TEST(ElementwiseUnary, NaNPropagates) {
  Tensor x = from_vector<float>({NAN, 1.0f});
  EXPECT_TRUE(std::isnan(relu(x).to_vector<float>()[0]));
  EXPECT_TRUE(std::isnan(leaky_relu(x).to_vector<float>()[0]));
  EXPECT_TRUE(std::isnan(clamp(x, 0.0, 0.5).to_vector<float>()[0]));
  EXPECT_EQ(clamp(x, 0.0, 0.5).to_vector<float>()[1], 0.5f);
  EXPECT_TRUE(std::isnan(maximum(x, from_vector<float>({1.0f, NAN})).to_vector<float>()[0]));
  EXPECT_TRUE(std::isnan(maximum(x, from_vector<float>({1.0f, NAN})).to_vector<float>()[1]));
  EXPECT_TRUE(std::isnan(minimum(from_vector<float>({1.0f}), from_vector<float>({NAN})).to_vector<float>()[0]));
  EXPECT_TRUE(std::isnan(abs(x).to_vector<float>()[0]));
}

TEST(ElementwiseUnary, IntegerInputs) {
  for (DType dt : {DType::i32, DType::i64}) {
    Tensor x = randint(-50, 50, {4, 5}, {dt});
    const RefTensor rx = reference::from_tensor(x);
    SCOPED_TRACE(::testing::Message() << dt);
    EXPECT_EQ(neg(x).dtype(), dt);
    EXPECT_TRUE(all_close(neg(x), reference::neg(rx), 0, 0));
    EXPECT_TRUE(all_close(abs(x.t()), reference::abs(reference::from_tensor(x.t())), 0, 0));
    EXPECT_TRUE(all_close(relu(x), reference::relu(rx), 0, 0));
    EXPECT_TRUE(all_close(clamp(x, -10.5, 20.0), reference::clamp(rx, -10.0, 20.0), 0, 0));
    EXPECT_TRUE(all_close(clamp(x, std::nullopt, 1e30), rx, 0, 0));
    EXPECT_TRUE(all_close(clamp(x, -1e30, std::nullopt), rx, 0, 0));
    // transcendental ops compute in float32
    EXPECT_EQ(exp(x).dtype(), DType::f32);
    EXPECT_TRUE(all_close(sigmoid(x), reference::sigmoid(rx), 1e-6, 1e-6));
    EXPECT_TRUE(all_close(pow(abs(x), 0.5), reference::sqrt(reference::abs(rx)), 1e-6, 1e-6));
  }
  EXPECT_EQ(sqrt(from_vector<bool>({true, false})).to_vector<float>(), (std::vector<float>{1.0f, 0.0f}));
}

TEST(ElementwiseUnary, MethodsMatchFreeFunctions) {
  Tensor x = random_tensor({3, 4}, DType::f32, true, 0.1, 2.0);
  auto same = [](const Tensor& a, const Tensor& b) { return all_close(a, b, 0, 0); };
  EXPECT_TRUE(same(x.neg(), neg(x)));
  EXPECT_TRUE(same(x.exp(), exp(x)));
  EXPECT_TRUE(same(x.log(), log(x)));
  EXPECT_TRUE(same(x.sqrt(), sqrt(x)));
  EXPECT_TRUE(same(x.rsqrt(), rsqrt(x)));
  EXPECT_TRUE(same(x.tanh(), tanh(x)));
  EXPECT_TRUE(same(x.sigmoid(), sigmoid(x)));
  EXPECT_TRUE(same(x.relu(), relu(x)));
  EXPECT_TRUE(same(x.gelu(), gelu(x)));
  EXPECT_TRUE(same(x.gelu(true), gelu(x, true)));
  EXPECT_TRUE(same(x.abs(), abs(x)));
  EXPECT_TRUE(same(x.pow(1.5), pow(x, 1.5)));
  EXPECT_TRUE(same(x.clamp(0.5, 1.0), clamp(x, 0.5, 1.0)));
  EXPECT_TRUE(same(-x, neg(x)));
  EXPECT_FALSE(same(x.gelu(), x.gelu(true)));
}

TEST(ElementwiseUnary, Errors) {
  Tensor b = zeros({2, 3}, {DType::boolean});
  EXPECT_EMBER_ERROR(neg(b), "neg", "bool", "[2, 3]");
  EXPECT_EMBER_ERROR(abs(b), "abs", "bool");
  EXPECT_EMBER_ERROR(clamp(zeros({2}), std::nullopt, std::nullopt), "clamp", "min", "max");
  // leaky_relu takes floating-point input only (PyTorch refuses integers too)
  EXPECT_EMBER_ERROR(leaky_relu(zeros({2, 3}, {DType::i64})), "leaky_relu", "floating-point", "int64", "[2, 3]");
  EXPECT_EMBER_ERROR(leaky_relu(zeros({4}, {DType::i32}), 0.2), "leaky_relu", "int32", "[4]");
  EXPECT_EMBER_ERROR(leaky_relu(b), "leaky_relu", "bool", "[2, 3]");
}
