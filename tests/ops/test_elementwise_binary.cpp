// Two-operand elementwise ops (arithmetic, comparisons, where, masked_fill, add_/mul_):
// forward against the double reference over broadcast pairs, memory layouts, empty and
// size-1 dims and every dtype; backward through gradcheck; errors that name the op and shapes.
#include <cmath>
#include <functional>
#include <tuple>

#include "kernels/reference/elementwise.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::kFloatTypes;
using ember::testing::random_broadcast_pair;
using ember::testing::random_tensor;
using ember::testing::rng;
using ember::testing::tolerance;
using reference::RefTensor;

namespace {

using TensorOp = std::function<Tensor(const Tensor&, const Tensor&)>;
using RefOp = std::function<RefTensor(const RefTensor&, const RefTensor&)>;

struct BinaryCase {
  const char* name;
  TensorOp op;
  RefOp ref;
  double b_lo = -2.0, b_hi = 2.0;  // value range of the right operand
  double a_lo = -2.0, a_hi = 2.0;
};

std::vector<BinaryCase> float_cases() {
  return {
      {"add", [](auto& a, auto& b) { return add(a, b); }, [](auto& a, auto& b) { return reference::add(a, b); }},
      {"add alpha", [](auto& a, auto& b) { return add(a, b, -0.5); },
       [](auto& a, auto& b) { return reference::add(a, b, -0.5); }},
      {"sub", [](auto& a, auto& b) { return sub(a, b); }, [](auto& a, auto& b) { return reference::sub(a, b); }},
      {"sub alpha", [](auto& a, auto& b) { return sub(a, b, 3.0); },
       [](auto& a, auto& b) { return reference::sub(a, b, 3.0); }},
      {"mul", [](auto& a, auto& b) { return mul(a, b); }, [](auto& a, auto& b) { return reference::mul(a, b); }},
      {"div", [](auto& a, auto& b) { return div(a, b); }, [](auto& a, auto& b) { return reference::div(a, b); },
       0.5, 2.0},
      {"pow", [](auto& a, auto& b) { return pow(a, b); }, [](auto& a, auto& b) { return reference::pow(a, b); },
       -2.0, 2.0, 0.5, 2.0},
      {"maximum", [](auto& a, auto& b) { return maximum(a, b); },
       [](auto& a, auto& b) { return reference::maximum(a, b); }},
      {"minimum", [](auto& a, auto& b) { return minimum(a, b); },
       [](auto& a, auto& b) { return reference::minimum(a, b); }},
      {"operator+", [](auto& a, auto& b) { return a + b; }, [](auto& a, auto& b) { return reference::add(a, b); }},
      {"operator-", [](auto& a, auto& b) { return a - b; }, [](auto& a, auto& b) { return reference::sub(a, b); }},
      {"operator*", [](auto& a, auto& b) { return a * b; }, [](auto& a, auto& b) { return reference::mul(a, b); }},
      {"operator/", [](auto& a, auto& b) { return a / b; }, [](auto& a, auto& b) { return reference::div(a, b); },
       0.5, 2.0},
  };
}

// Random sign for a right operand drawn from [lo, hi] with lo > 0 (keeps divisors away from 0).
Tensor operand(const Shape& s, DType dt, bool non_contiguous, double lo, double hi, bool random_sign) {
  Tensor t = random_tensor(s, dt, non_contiguous, lo, hi);
  if (!random_sign) return t;
  Tensor sign = random_tensor(s, DType::f64, false, -1.0, 1.0);
  return where(gt(sign, 0.0), t, neg(t));
}

::testing::AssertionResult check_case(const BinaryCase& c, const Tensor& a, const Tensor& b) {
  const Tensor y = c.op(a, b);
  const DType want = promote_types(a.dtype(), b.dtype());
  if (y.dtype() != want) return ::testing::AssertionFailure() << "dtype " << y.dtype() << " != " << want;
  const double tol = tolerance(y.dtype());
  return all_close(y, c.ref(reference::from_tensor(a), reference::from_tensor(b)), tol, tol);
}

}  // namespace

TEST(ElementwiseBinary, FloatOpsMatchReferenceOnBroadcastPairs) {
  for (const BinaryCase& c : float_cases()) {
    for (DType dt : kFloatTypes) {
      for (int trial = 0; trial < 6; ++trial) {
        const int ndim = trial % 5;
        auto [sa, sb] = random_broadcast_pair(ndim);
        const bool nc_a = trial % 2 == 1, nc_b = trial % 3 == 1;
        const bool div_like = c.b_lo > 0 && c.a_lo < 0;
        Tensor a = random_tensor(sa, dt, nc_a, c.a_lo, c.a_hi);
        Tensor b = operand(sb, dt, nc_b, c.b_lo, c.b_hi, div_like);
        SCOPED_TRACE(::testing::Message() << c.name << " " << dt << " " << shape_str(sa) << " with "
                                          << shape_str(sb) << (nc_a ? " a strided" : "") << (nc_b ? " b strided" : ""));
        EXPECT_TRUE(check_case(c, a, b));
      }
    }
  }
}

TEST(ElementwiseBinary, EmptyAndSizeOneDims) {
  const std::vector<std::pair<Shape, Shape>> pairs = {
      {{0, 3}, {1, 3}}, {{0}, {1}}, {{2, 0, 4}, {4}}, {{1}, {4, 1}}, {{}, {3, 2}}, {{3, 1, 2}, {1, 5, 1}},
      {{}, {}},         {{1, 1}, {1}}};
  for (const BinaryCase& c : float_cases()) {
    for (auto [sa, sb] : pairs) {
      Tensor a = random_tensor(sa, DType::f32, false, c.a_lo, c.a_hi);
      Tensor b = random_tensor(sb, DType::f32, false, c.b_lo, c.b_hi);
      SCOPED_TRACE(::testing::Message() << c.name << " " << shape_str(sa) << " with " << shape_str(sb));
      EXPECT_TRUE(check_case(c, a, b));
      // and the other way round
      Tensor a2 = random_tensor(sb, DType::f32, false, c.a_lo, c.a_hi);
      Tensor b2 = random_tensor(sa, DType::f32, false, c.b_lo, c.b_hi);
      EXPECT_TRUE(check_case(c, a2, b2));
    }
  }
}

TEST(ElementwiseBinary, ExpandedAndLargeOperands) {
  // stride-0 operands (expand) and sizes big enough to be split across threads
  Tensor row = random_tensor({1, 300});
  Tensor col = random_tensor({250, 1}, DType::f32, false, 0.5, 2.0);
  for (const BinaryCase& c : float_cases()) {
    if (std::string(c.name).find(' ') != std::string::npos || c.name[0] == 'o') continue;  // one case per kernel
    SCOPED_TRACE(c.name);
    Tensor a = random_tensor({250, 300}, DType::f32, false, c.a_lo, c.a_hi);
    Tensor b = random_tensor({250, 300}, DType::f32, false, c.b_lo, c.b_hi);
    EXPECT_TRUE(check_case(c, a, b));
    EXPECT_TRUE(check_case(c, a, col));
    EXPECT_TRUE(check_case(c, add(abs(row.expand({250, 300})), 0.5), b));
    EXPECT_TRUE(check_case(c, a.t(), b.t()));
    EXPECT_TRUE(check_case(c, a.t(), col.t()));
  }
}

TEST(ElementwiseBinary, MixedDtypesPromote) {
  Tensor a = random_tensor({3, 4}, DType::f16);
  Tensor b = random_tensor({4}, DType::f32, false, 0.5, 2.0);
  Tensor i = randint(-5, 5, {3, 4}, {DType::i32});
  Tensor l = randint(-5, 5, {4}, {DType::i64});
  EXPECT_EQ(add(a, b).dtype(), DType::f32);
  EXPECT_EQ(mul(a, random_tensor({4}, DType::bf16)).dtype(), DType::f32);
  EXPECT_EQ(add(a, random_tensor({4}, DType::f64)).dtype(), DType::f64);
  EXPECT_EQ(add(i, b).dtype(), DType::f32);
  EXPECT_EQ(add(i, l).dtype(), DType::i64);
  EXPECT_TRUE(all_close(add(i, b), reference::add(reference::from_tensor(i), reference::from_tensor(b)), 1e-6, 1e-6));
  EXPECT_EQ(mul(a, i).dtype(), DType::f16);
  const double h = tolerance(DType::f16);
  EXPECT_TRUE(all_close(mul(a, i), reference::mul(reference::from_tensor(a), reference::from_tensor(i)), h, h));
}

TEST(ElementwiseBinary, IntegerOpsAreExact) {
  for (DType dt : {DType::i32, DType::i64}) {
    for (int trial = 0; trial < 6; ++trial) {
      auto [sa, sb] = random_broadcast_pair(trial % 4);
      Tensor a = randint(-1000, 1000, sa, {dt});
      Tensor b = randint(-1000, 1000, sb, {dt});
      if (a.dim() == 2) a = a.t().contiguous().t();  // same values, transposed layout
      const RefTensor ra = reference::from_tensor(a), rb = reference::from_tensor(b);
      SCOPED_TRACE(::testing::Message() << dt << " " << shape_str(sa) << " with " << shape_str(sb));
      EXPECT_EQ(add(a, b).dtype(), dt);
      EXPECT_TRUE(all_close(add(a, b, 3.0), reference::add(ra, rb, 3.0), 0, 0));
      EXPECT_TRUE(all_close(sub(a, b), reference::sub(ra, rb), 0, 0));
      EXPECT_TRUE(all_close(mul(a, b), reference::mul(ra, rb), 0, 0));
      EXPECT_TRUE(all_close(maximum(a, b), reference::maximum(ra, rb), 0, 0));
      EXPECT_TRUE(all_close(minimum(a, b), reference::minimum(ra, rb), 0, 0));
      EXPECT_TRUE(all_close(add(a, 7.0), reference::add(ra, RefTensor({}, 7.0)), 0, 0));
    }
  }
  // int64 beyond float precision stays exact
  Tensor big = from_vector<int64_t>({(int64_t(1) << 53) + 1, -(int64_t(1) << 60)});
  EXPECT_EQ(add(big, big).to_vector<int64_t>(), (std::vector<int64_t>{(int64_t(1) << 54) + 2, -(int64_t(1) << 61)}));
  EXPECT_EQ(mul(big, 2.0).to_vector<int64_t>(), (std::vector<int64_t>{(int64_t(1) << 54) + 2, -(int64_t(1) << 61)}));
}

TEST(ElementwiseBinary, IntegerDivisionIsTrueDivision) {
  Tensor a = from_vector<int64_t>({7, -7, 1, 0});
  Tensor b = from_vector<int32_t>({2, 2, 3, 5});
  Tensor q = div(a, b);
  EXPECT_EQ(q.dtype(), DType::f32);
  EXPECT_TRUE(all_close(q, reference::div(reference::from_tensor(a), reference::from_tensor(b)), 1e-7, 0));
  Tensor h = div(a, 2.0);
  EXPECT_EQ(h.dtype(), DType::f32);
  EXPECT_EQ(h.to_vector<float>(), (std::vector<float>{3.5f, -3.5f, 0.5f, 0.0f}));
}

TEST(ElementwiseBinary, BoolArithmeticIsLogical) {
  Tensor a = from_vector<bool>({true, true, false, false});
  Tensor b = from_vector<bool>({true, false, true, false});
  EXPECT_EQ(add(a, b).dtype(), DType::boolean);
  EXPECT_EQ(add(a, b).to_vector<bool>(), (std::vector<bool>{true, true, true, false}));
  EXPECT_EQ(mul(a, b).to_vector<bool>(), (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(maximum(a, b).to_vector<bool>(), (std::vector<bool>{true, true, true, false}));
  EXPECT_EQ(minimum(a, b).to_vector<bool>(), (std::vector<bool>{true, false, false, false}));
  Tensor n = add(a, 1.0);  // bool with a number counts
  EXPECT_EQ(n.dtype(), DType::i64);
  EXPECT_EQ(n.to_vector<int64_t>(), (std::vector<int64_t>{2, 2, 1, 1}));
  EXPECT_EQ(add(a, from_vector<int32_t>({1, 1, 1, 1})).to_vector<int32_t>(), (std::vector<int32_t>{2, 2, 1, 1}));
}

TEST(ElementwiseBinary, ScalarOperandsKeepTheTensorDtype) {
  for (DType dt : kFloatTypes) {
    Tensor x = random_tensor({3, 5}, dt, true);
    const RefTensor rx = reference::from_tensor(x);
    const double tol = tolerance(dt);
    SCOPED_TRACE(::testing::Message() << dt);
    EXPECT_EQ((x + 2.0).dtype(), dt);
    EXPECT_TRUE(all_close(x + 2.5, reference::add(rx, RefTensor({}, 2.5)), tol, tol));
    EXPECT_TRUE(all_close(x - 0.25, reference::sub(rx, RefTensor({}, 0.25)), tol, tol));
    EXPECT_TRUE(all_close(x * -3.0, reference::mul(rx, RefTensor({}, -3.0)), tol, tol));
    EXPECT_TRUE(all_close(x / 4.0, reference::div(rx, RefTensor({}, 4.0)), tol, tol));
    EXPECT_TRUE(all_close(1.5 + x, reference::add(rx, RefTensor({}, 1.5)), tol, tol));
    EXPECT_TRUE(all_close(1.5 - x, reference::sub(RefTensor({}, 1.5), rx), tol, tol));
    EXPECT_TRUE(all_close(2.0 * x, reference::mul(rx, RefTensor({}, 2.0)), tol, tol));
  }
  Tensor i = from_vector<int32_t>({1, -2, 3});
  EXPECT_EQ((i + 2.0).dtype(), DType::i32);
  EXPECT_EQ((i * 3.0).to_vector<int32_t>(), (std::vector<int32_t>{3, -6, 9}));
  EXPECT_EQ((i - 1.0).to_vector<int32_t>(), (std::vector<int32_t>{0, -3, 2}));
  Tensor f = i + 0.5;  // a fractional scalar turns an integer tensor into float32
  EXPECT_EQ(f.dtype(), DType::f32);
  EXPECT_EQ(f.to_vector<float>(), (std::vector<float>{1.5f, -1.5f, 3.5f}));
}

TEST(ElementwiseBinary, ComparisonsGiveBool) {
  using CmpOp = Tensor (*)(const Tensor&, const Tensor&);
  using CmpScalar = Tensor (*)(const Tensor&, double);
  using RefCmp = RefTensor (*)(const RefTensor&, const RefTensor&);
  const std::vector<std::tuple<const char*, CmpOp, CmpScalar, RefCmp>> ops = {
      {"eq", &eq, &eq, &reference::eq}, {"ne", &ne, &ne, &reference::ne}, {"lt", &lt, &lt, &reference::lt},
      {"le", &le, &le, &reference::le}, {"gt", &gt, &gt, &reference::gt}, {"ge", &ge, &ge, &reference::ge}};
  for (auto [name, op, op_s, ref] : ops) {
    for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
      for (int trial = 0; trial < 4; ++trial) {
        auto [sa, sb] = random_broadcast_pair(trial % 4);
        // small integer values make ties common
        Tensor a = randint(-2, 3, sa, {dt});
        Tensor b = randint(-2, 3, sb, {trial % 2 ? DType::f32 : dt});
        if (trial == 3 && a.dim() == 2) a = a.t().contiguous().t();
        SCOPED_TRACE(::testing::Message() << name << " " << dt << " " << shape_str(sa) << " with " << shape_str(sb));
        Tensor y = op(a, b);
        EXPECT_EQ(y.dtype(), DType::boolean);
        EXPECT_FALSE(y.requires_grad());
        EXPECT_TRUE(all_close(y, ref(reference::from_tensor(a), reference::from_tensor(b)), 0, 0));
        EXPECT_TRUE(all_close(op_s(a, 1.0), ref(reference::from_tensor(a), RefTensor({}, 1.0)), 0, 0));
      }
    }
  }
  // the scalar takes the tensor's dtype before comparing
  EXPECT_TRUE(eq(full({2}, 0.1), 0.1).to_vector<bool>()[0]);
  EXPECT_TRUE(eq(full({2}, 0.1, {DType::f16}), 0.1).to_vector<bool>()[1]);
  EXPECT_FALSE(eq(from_vector<int64_t>({1}), 1.5).to_vector<bool>()[0]);
  EXPECT_TRUE(lt(from_vector<int64_t>({1}), 1.5).to_vector<bool>()[0]);
  Tensor x = random_tensor({4}).requires_grad_();
  EXPECT_FALSE(gt(x, 0.0).requires_grad());
}

TEST(ElementwiseBinary, WhereBroadcastsAllThree) {
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::boolean}) {
    for (int trial = 0; trial < 5; ++trial) {
      auto [s1, s2] = random_broadcast_pair(3);
      Shape s3 = trial % 2 ? s1 : Shape{1};
      Tensor cond = gt(random_tensor(trial % 3 == 0 ? s3 : s1, DType::f32, trial == 2), 0.0);
      Tensor a = random_tensor(s2, DType::f64, trial % 2 == 1).to(dt);
      Tensor b = random_tensor(s3, DType::f64, false).to(dt);
      SCOPED_TRACE(::testing::Message() << dt << " cond " << shape_str(cond.shape()) << " a " << shape_str(s2)
                                        << " b " << shape_str(s3));
      Tensor y = where(cond, a, b);
      EXPECT_EQ(y.dtype(), dt);
      EXPECT_TRUE(all_close(y, reference::where(reference::from_tensor(cond), reference::from_tensor(a),
                                                reference::from_tensor(b)), 0, 0));
    }
  }
  EXPECT_EQ(where(from_vector<bool>({true, false}), from_vector<int32_t>({1, 2}), from_vector<float>({0.5f, 0.25f}))
                .to_vector<float>(),
            (std::vector<float>{1.0f, 0.25f}));
}

TEST(ElementwiseBinary, MaskedFillBroadcastsTheMask) {
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
    for (int trial = 0; trial < 4; ++trial) {
      Shape sx = ember::testing::random_shape(3);
      Shape sm = sx;
      if (trial % 2) sm[1] = 1;
      if (trial >= 2) sm.erase(sm.begin());
      Tensor x = random_tensor(sx, DType::f64, trial == 1).to(dt);
      Tensor mask = gt(random_tensor(sm), 0.0);
      SCOPED_TRACE(::testing::Message() << dt << " x " << shape_str(sx) << " mask " << shape_str(sm));
      Tensor y = masked_fill(x, mask, -3.0);
      EXPECT_EQ(y.dtype(), dt);
      EXPECT_TRUE(all_close(y, reference::masked_fill(reference::from_tensor(x), reference::from_tensor(mask), -3.0), 0, 0));
      EXPECT_TRUE(all_close(x.masked_fill(mask, 1.0), reference::masked_fill(reference::from_tensor(x), reference::from_tensor(mask), 1.0), 0, 0));
    }
  }
  Tensor x = zeros({2, 2});
  Tensor y = masked_fill(x, from_vector<bool>({true, false}), -INFINITY);
  EXPECT_TRUE(std::isinf(y.to_vector<float>()[0]));
  EXPECT_EQ(y.to_vector<float>()[1], 0.0f);
  EXPECT_EQ(masked_fill(zeros({0, 3}), from_vector<bool>({true, false, true}), 1.0).shape(), (Shape{0, 3}));
}

TEST(ElementwiseBinary, AddInPlaceOnNonContiguousView) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(::testing::Message() << dt);
    Tensor base = random_tensor({5, 8}, dt);
    const RefTensor before = reference::from_tensor(base);
    Tensor view = base.t().slice(0, 1, 7, 2);  // [3, 5], strides (2, 8)
    ASSERT_FALSE(view.is_contiguous());
    Tensor other = random_tensor({5}, DType::f64);  // broadcast over rows, other dtype
    const RefTensor want = reference::add(reference::from_tensor(view), reference::from_tensor(other), 0.5);
    Tensor& same = view.add_(other, 0.5);
    EXPECT_TRUE(same.is_same(view));
    EXPECT_EQ(view.dtype(), dt);
    const double tol = tolerance(dt);
    EXPECT_TRUE(all_close(view, want, tol, tol));
    // everything outside the view is untouched
    const RefTensor after = reference::from_tensor(base);
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t c = 0; c < 8; ++c)
        if (!(c == 1 || c == 3 || c == 5)) {
          EXPECT_EQ(after.at({r, c}), before.at({r, c})) << r << "," << c;
        }
  }
}

TEST(ElementwiseBinary, AddInPlaceWithAliasingOperands) {
  Tensor x = random_tensor({4, 3}, DType::f64);
  const RefTensor rx = reference::from_tensor(x);
  x.add_(x);
  EXPECT_TRUE(all_close(x, reference::add(rx, rx), 1e-12, 0));
  // other is a row of self: every row must see the row's original values
  Tensor y = random_tensor({4, 3}, DType::f64);
  const RefTensor ry = reference::from_tensor(y);
  RefTensor row0({3});
  for (int64_t c = 0; c < 3; ++c) row0.data[size_t(c)] = ry.at({0, c});
  y.add_(y.select(0, 0), 2.0);
  EXPECT_TRUE(all_close(y, reference::add(ry, row0, 2.0), 1e-12, 0));
  // other is self transposed
  Tensor z = random_tensor({3, 3}, DType::f64);
  const RefTensor rz = reference::from_tensor(z);
  z.add_(z.t());
  EXPECT_TRUE(all_close(z, reference::add(rz, reference::from_tensor(from_vector(rz.data, {3, 3}, {DType::f64}).t())), 1e-12, 0));
}

TEST(ElementwiseBinary, AddInPlaceIntegersAndLargeTensors) {
  Tensor i = from_vector<int64_t>({1, 2, 3});
  i.add_(from_vector<int32_t>({10, 20, 30}), 2.0);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{21, 42, 63}));
  Tensor big = random_tensor({300, 1000});
  Tensor g = random_tensor({300, 1000}, DType::f16);
  const RefTensor want = reference::add(reference::from_tensor(big), reference::from_tensor(g));
  big.add_(g);
  EXPECT_TRUE(all_close(big, want, 1e-6, 1e-6));
  Tensor h = random_tensor({64, 33}, DType::bf16, true);
  const RefTensor hw = reference::mul(reference::from_tensor(h), RefTensor({}, 0.25));
  h.mul_(0.25);
  EXPECT_TRUE(all_close(h, hw, 0, 0));  // scaling by a power of two is exact
  Tensor k = from_vector<int32_t>({1, -2});
  k.mul_(3.0);
  EXPECT_EQ(k.to_vector<int32_t>(), (std::vector<int32_t>{3, -6}));
}

TEST(ElementwiseBinary, InPlaceRefusesTensorsThatRequireGrad) {
  Tensor w = random_tensor({3}).requires_grad_();
  EXPECT_EMBER_ERROR(w.add_(ones({3})), "add_", "requires grad");
  EXPECT_EMBER_ERROR(w.mul_(2.0), "mul_", "requires grad");
  {
    NoGradGuard ng;
    const std::vector<float> before = w.to_vector<float>();
    w.add_(ones({3}), -1.0);
    w.mul_(2.0);
    const std::vector<float> after = w.to_vector<float>();
    for (size_t k = 0; k < 3; ++k) EXPECT_FLOAT_EQ(after[k], (before[k] - 1.0f) * 2.0f);
  }
  EXPECT_TRUE(w.requires_grad());
  EXPECT_TRUE(w.is_leaf());
}

TEST(ElementwiseBinary, ErrorsNameTheOpAndShapes) {
  Tensor a = zeros({2, 3}), b = zeros({4});
  EXPECT_EMBER_ERROR(add(a, b), "add", "[2, 3]", "[4]");
  EXPECT_EMBER_ERROR(sub(a, b), "sub", "[2, 3]", "[4]");
  EXPECT_EMBER_ERROR(mul(a, b), "mul", "[2, 3]", "[4]");
  EXPECT_EMBER_ERROR(div(a, b), "div", "[2, 3]", "[4]");
  EXPECT_EMBER_ERROR(pow(a, b), "pow", "[2, 3]", "[4]");
  EXPECT_EMBER_ERROR(maximum(a, b), "maximum", "[2, 3]", "[4]");
  EXPECT_EMBER_ERROR(minimum(a, b), "minimum", "[2, 3]", "[4]");
  EXPECT_EMBER_ERROR(eq(a, b), "eq", "[2, 3]", "[4]");
  EXPECT_EMBER_ERROR(ge(a, b), "ge", "[2, 3]", "[4]");
  EXPECT_EMBER_ERROR(where(gt(a, 0.0), a, b), "where", "[2, 3]", "[4]");
  EXPECT_EMBER_ERROR(where(zeros({5}, {DType::boolean}), a, a), "where", "[5]", "[2, 3]");
  EXPECT_EMBER_ERROR(where(a, a, a), "where", "bool", "float32", "[2, 3]");
  EXPECT_EMBER_ERROR(masked_fill(a, a, 1.0), "masked_fill", "bool", "float32");
  EXPECT_EMBER_ERROR(masked_fill(a, zeros({4}, {DType::boolean}), 1.0), "masked_fill", "[4]", "[2, 3]");
  EXPECT_EMBER_ERROR(masked_fill(zeros({3}), zeros({2, 3}, {DType::boolean}), 1.0), "masked_fill", "[2, 3]", "[3]");
  EXPECT_EMBER_ERROR(a.add_(zeros({4, 2, 3})), "add_", "[4, 2, 3]", "[2, 3]");
  EXPECT_EMBER_ERROR(a.add_(b), "add_", "[4]", "[2, 3]");
  EXPECT_EMBER_ERROR(zeros({2}, {DType::i64}).add_(ones({2})), "float32", "int64");
  EXPECT_EMBER_ERROR(zeros({2}, {DType::i32}).mul_(0.5), "mul", "int32");
  EXPECT_EMBER_ERROR(add(zeros({2}, {DType::i64}), zeros({2}, {DType::i64}), 0.5), "add", "alpha", "0.5");
  EXPECT_EMBER_ERROR(sub(zeros({2}, {DType::boolean}), zeros({2}, {DType::boolean})), "sub", "bool");
  Tensor expanded = zeros({3, 1}).expand({3, 4});
  EXPECT_EMBER_ERROR(expanded.add_(ones({3, 4})), "add", "[3, 4]", "expanded");
  EXPECT_EMBER_ERROR(expanded.mul_(2.0), "mul", "[3, 4]", "expanded");
  EXPECT_EMBER_ERROR(masked_fill(zeros({2}, {DType::i64}), from_vector<bool>({true, false}), NAN), "masked_fill",
                     "nan", "int64");
}

// ---- gradients (float64 finite differences)

namespace {

::testing::AssertionResult grad_ok(const std::function<Tensor(const Tensor&, const Tensor&)>& f, const Tensor& a,
                                   const Tensor& b) {
  auto r = gradcheck([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0], in[1])}; },
                     {a.detach().requires_grad_(), b.detach().requires_grad_()});
  if (r) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << r.message;
}

}  // namespace

TEST(ElementwiseBinary, GradcheckBroadcasting) {
  for (const BinaryCase& c : float_cases()) {
    for (int trial = 0; trial < 3; ++trial) {
      auto [sa, sb] = random_broadcast_pair(trial + 1, 3);
      Tensor a = random_tensor(sa, DType::f64, trial == 1, c.a_lo, c.a_hi);
      Tensor b = operand(sb, DType::f64, trial == 2, c.b_lo, c.b_hi, c.b_lo > 0 && c.a_lo < 0);
      SCOPED_TRACE(::testing::Message() << c.name << " " << shape_str(sa) << " with " << shape_str(sb));
      EXPECT_TRUE(grad_ok(c.op, a, b));
    }
  }
}

TEST(ElementwiseBinary, GradcheckScalarForms) {
  Tensor x = random_tensor({2, 3}, DType::f64, true);
  Tensor unused = zeros({1}, {DType::f64});
  EXPECT_TRUE(grad_ok([](auto& a, auto&) { return add(a, 1.5); }, x, unused));
  EXPECT_TRUE(grad_ok([](auto& a, auto&) { return sub(a, 1.5); }, x, unused));
  EXPECT_TRUE(grad_ok([](auto& a, auto&) { return mul(a, -2.5); }, x, unused));
  EXPECT_TRUE(grad_ok([](auto& a, auto&) { return div(a, 3.0); }, x, unused));
  EXPECT_TRUE(grad_ok([](auto& a, auto&) { return 2.0 - a; }, x, unused));
  EXPECT_TRUE(grad_ok([](auto& a, auto&) { return 2.0 / add(abs(a), 0.5); }, x, unused));
}

TEST(ElementwiseBinary, GradcheckWhereAndMaskedFill) {
  for (int trial = 0; trial < 3; ++trial) {
    auto [sa, sb] = random_broadcast_pair(2, 3);
    Tensor cond = gt(random_tensor(trial == 0 ? sa : sb), 0.0);
    Tensor a = random_tensor(sa, DType::f64), b = random_tensor(sb, DType::f64, true);
    SCOPED_TRACE(::testing::Message() << shape_str(cond.shape()) << " " << shape_str(sa) << " " << shape_str(sb));
    EXPECT_TRUE(grad_ok([&](auto& x, auto& y) { return where(cond, x, y); }, a, b));
    Tensor mask = gt(random_tensor(sa.empty() ? Shape{} : Shape{sa.back()}), 0.0);  // broadcast over rows
    EXPECT_TRUE(grad_ok([&](auto& x, auto& y) { return add(masked_fill(x, mask, 7.0), y); }, a, b));
  }
}

TEST(ElementwiseBinary, GradientsOfMixedDtypesComeBackInTheInputDtype) {
  Tensor a = random_tensor({3, 4}).requires_grad_();                    // f32
  Tensor b = random_tensor({4}, DType::f64).requires_grad_();           // f64, broadcast
  Tensor y = mul(a, b);
  EXPECT_EQ(y.dtype(), DType::f64);
  y.sum().backward();
  ASSERT_TRUE(a.grad().defined());
  EXPECT_EQ(a.grad().dtype(), DType::f32);
  EXPECT_EQ(b.grad().shape(), (Shape{4}));
  RefTensor want_a = reference::mul(RefTensor({3, 4}, 1.0), reference::from_tensor(b));
  EXPECT_TRUE(all_close(a.grad(), want_a, 1e-6, 1e-6));
  RefTensor ra = reference::from_tensor(a);
  RefTensor want_b({4});
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 4; ++c) want_b.data[size_t(c)] += ra.at({r, c});
  EXPECT_TRUE(all_close(b.grad(), want_b, 1e-12, 1e-12));
}

TEST(ElementwiseBinary, MaximumSplitsTiedGradientsEqually) {
  Tensor a = from_vector<double>({1.0, 2.0, 3.0}).requires_grad_();
  Tensor b = from_vector<double>({2.0, 2.0, 1.0}).requires_grad_();
  maximum(a, b).sum().backward();
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{0.0, 0.5, 1.0}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{1.0, 0.5, 0.0}));
  Tensor c = from_vector<double>({1.0, 2.0, 3.0}).requires_grad_();
  Tensor d = from_vector<double>({2.0, 2.0, 1.0}).requires_grad_();
  minimum(c, d).sum().backward();
  EXPECT_EQ(c.grad().to_vector<double>(), (std::vector<double>{1.0, 0.5, 0.0}));
  EXPECT_EQ(d.grad().to_vector<double>(), (std::vector<double>{0.0, 0.5, 1.0}));
}

TEST(ElementwiseBinary, PowGradientWithZeroBase) {
  // d(a^b)/db at a = 0, b > 0 is taken as 0 (not NaN), as PyTorch does
  Tensor a = from_vector<double>({0.0, 2.0}).requires_grad_();
  Tensor b = from_vector<double>({2.0, 3.0}).requires_grad_();
  pow(a, b).sum().backward();
  const std::vector<double> gb = b.grad().to_vector<double>();
  EXPECT_EQ(gb[0], 0.0);
  EXPECT_NEAR(gb[1], 8.0 * std::log(2.0), 1e-12);
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{0.0, 12.0}));
}

TEST(ElementwiseBinary, NoGraphWhenNothingRequiresGrad) {
  Tensor a = random_tensor({3}), b = random_tensor({3});
  EXPECT_FALSE(add(a, b).requires_grad());
  Tensor w = random_tensor({3}).requires_grad_();
  EXPECT_TRUE(add(a, w).requires_grad());
  EXPECT_EQ(mul(a, w).grad_fn()->name(), "MulBackward");
  {
    NoGradGuard ng;
    EXPECT_FALSE(mul(a, w).requires_grad());
  }
  Tensor y = where(gt(a, 0.0), w, b);
  y.sum().backward();
  const std::vector<float> av = a.to_vector<float>(), gw = w.grad().to_vector<float>();
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(gw[k], av[k] > 0 ? 1.0f : 0.0f);
}
