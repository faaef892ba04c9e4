// scaled_dot_product_attention (core/ops.h, the fused group): forward and gradients against the
// double reference for causal and plain attention, bool and additive masks, query and key
// lengths that differ, value dims that differ from the key dim, broadcast batch dims and
// non-contiguous inputs, in f32, f64 and bf16; dropout against the reference with the same keep
// mask in forward and backward, and its statistics; the unfused composition; gradcheck in f64;
// autocast; error messages.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/autocast.h"
#include "core/native/fused.h"
#include "kernels/reference/fused.h"
#include "kernels/reference/nn_functional.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::coin;
using ember::testing::expect_gradcheck;
using ember::testing::random_tensor;
using ember::testing::tolerance;
using ember::testing::uniform_int;
using ember::testing::with_one_and_two_threads;
using reference::RefTensor;

namespace {

enum class MaskKind { None, Causal, Bool, Additive };

const char* mask_name(MaskKind m) {
  switch (m) {
    case MaskKind::None: return "no mask";
    case MaskKind::Causal: return "causal";
    case MaskKind::Bool: return "bool mask";
    default: return "additive mask";
  }
}

// One problem: shapes of q, k, v and the mask (leading dims broadcasting to `batch`).
struct Problem {
  Shape batch, q, k, v, mask;
  MaskKind kind = MaskKind::None;
  double p = 0.0;
  std::string describe() const {
    return std::string("q ") + shape_str(q) + " k " + shape_str(k) + " v " + shape_str(v) + " " + mask_name(kind) +
           (kind == MaskKind::Bool || kind == MaskKind::Additive ? " " + shape_str(mask) : "") + " p " +
           std::to_string(p);
  }
};

// Leading dims of `batch` with some set to 1 or dropped (what broadcasts back to it).
Shape broadcastable(const Shape& batch) {
  Shape s;
  const size_t drop = coin() ? size_t(uniform_int(0, int64_t(batch.size()))) : 0;
  for (size_t i = drop; i < batch.size(); ++i) s.push_back(coin() ? 1 : batch[i]);
  return s;
}

Shape with_tail(Shape s, int64_t a, int64_t b) {
  s.push_back(a);
  s.push_back(b);
  return s;
}

Problem random_problem(MaskKind kind, double p, int64_t max_len = 13) {
  Problem r;
  r.batch = {uniform_int(1, 3), uniform_int(1, 3)};
  const int64_t lq = uniform_int(1, max_len), lk = uniform_int(1, max_len), e = uniform_int(1, 9),
                ev = uniform_int(1, 9);
  r.q = with_tail(r.batch, lq, e);
  r.k = with_tail(broadcastable(r.batch), lk, e);
  r.v = with_tail(coin() ? r.batch : broadcastable(r.batch), lk, ev);
  r.kind = kind;
  r.p = p;
  if (kind == MaskKind::Bool || kind == MaskKind::Additive)
    r.mask = with_tail(broadcastable(r.batch), coin() ? 1 : lq, lk);
  return r;
}

// A bool mask with key 0 always taking part (a row with no key is NaN in torch too).
Tensor make_mask(const Problem& pr) {
  if (pr.kind == MaskKind::Bool) {
    Tensor r = random_tensor(pr.mask, DType::f32, false, 0.0, 1.0);
    r.narrow(-1, 0, 1).fill_(1.0);
    return gt(r, 0.35);
  }
  if (pr.kind == MaskKind::Additive) return random_tensor(pr.mask, DType::f32, false, -4.0, 0.5);
  return Tensor();
}

// x broadcast to batch + its two trailing dims, as a [pairs, rows, cols] reference tensor.
RefTensor flat_ref(const Tensor& x, const Shape& batch) {
  const Shape full = with_tail(batch, x.size(-2), x.size(-1));
  const Tensor t = x.to(DType::f64).expand(full).contiguous();
  return reference::from_tensor(t.reshape({numel_of(batch), x.size(-2), x.size(-1)}));
}

// The reference's additive mask: bool masks as 0 / -inf.
Tensor additive(const Tensor& mask) {
  if (!mask.defined() || mask.dtype() != DType::boolean) return mask;
  return where(mask, full({}, 0.0, {DType::f64}), full({}, -std::numeric_limits<double>::infinity(), {DType::f64}));
}

// A reference gradient [pairs, rows, cols] summed back to the input's shape.
Tensor grad_to(const RefTensor& g, const Shape& batch, const Shape& shape) {
  Tensor t = reference::to_tensor(g).reshape(with_tail(batch, shape[shape.size() - 2], shape.back()));
  const int64_t lead = t.dim() - int64_t(shape.size());
  Shape dims;
  for (int64_t i = 0; i < t.dim(); ++i)
    if (i < lead || (shape[size_t(i - lead)] == 1 && t.size(i) != 1)) dims.push_back(i);
  if (!dims.empty()) t = t.sum(dims, true);
  return t.reshape(shape);
}

struct Grads {
  Tensor y, dq, dk, dv;
};

Grads run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const Problem& pr, const Tensor& g,
          std::optional<double> scale = std::nullopt) {
  Tensor lq = q.detach().requires_grad_(), lk = k.detach().requires_grad_(), lv = v.detach().requires_grad_();
  Tensor y = scaled_dot_product_attention(lq, lk, lv, mask, pr.p, pr.kind == MaskKind::Causal, scale);
  y.backward(g);
  return {y.detach(), lq.grad(), lk.grad(), lv.grad()};
}

void check_against_reference(const Problem& pr, DType dt) {
  SCOPED_TRACE(pr.describe() + " " + dtype_name(dt));
  const Tensor q = random_tensor(pr.q, dt, coin(), -1.5, 1.5), k = random_tensor(pr.k, dt, coin(), -1.5, 1.5),
               v = random_tensor(pr.v, dt, coin(), -1.5, 1.5);
  const Tensor mask = make_mask(pr);
  const int64_t lq = pr.q[pr.q.size() - 2], lk = pr.k[pr.k.size() - 2];
  const Shape batch = broadcast_shapes(broadcast_shapes(Shape(pr.q.begin(), pr.q.end() - 2),
                                                        Shape(pr.k.begin(), pr.k.end() - 2), "test"),
                                       Shape(pr.v.begin(), pr.v.end() - 2), "test");
  const int64_t pairs = numel_of(batch);
  const bool causal = pr.kind == MaskKind::Causal;
  const double scale = 1.0 / std::sqrt(double(q.size(-1)));
  const Tensor g = random_tensor(with_tail(batch, lq, v.size(-1)), dt);
  const GeneratorState st = default_generator().get_state();
  const Grads got = run(q, k, v, mask, pr, g);
  EXPECT_EQ(got.y.dtype(), dt);
  EXPECT_EQ(got.y.shape(), with_tail(batch, lq, v.size(-1)));

  const RefTensor keep = reference::dropout_mask({pairs, lq, lk}, pr.p, st);
  const RefTensor* kp = pr.p > 0 ? &keep : nullptr;
  const RefTensor rm = mask.defined() ? flat_ref(additive(mask).expand(with_tail(batch, lq, lk)), batch) : RefTensor();
  const RefTensor* pm = mask.defined() ? &rm : nullptr;
  const RefTensor rq = flat_ref(q, batch), rk = flat_ref(k, batch), rv = flat_ref(v, batch);
  const RefTensor want = reference::scaled_dot_product_attention(rq, rk, rv, pm, causal, scale, kp, pr.p);
  const bool half = dt == DType::bf16;
  const double tol = half ? 3 * tolerance(dt) : 10 * tolerance(dt);
  EXPECT_TRUE(all_close(got.y.reshape({pairs, lq, v.size(-1)}), want, tol, tol)) << "forward";

  const reference::AttentionGrads rg = reference::scaled_dot_product_attention_backward(
      flat_ref(g, batch), rq, rk, rv, pm, causal, scale, kp, pr.p);
  const double gtol = half ? 8 * tolerance(dt) : dt == DType::f64 ? 1e-8 : 2e-4;
  EXPECT_TRUE(all_close(got.dq, grad_to(rg.dq, batch, pr.q), gtol, gtol)) << "dq";
  EXPECT_TRUE(all_close(got.dk, grad_to(rg.dk, batch, pr.k), gtol, gtol)) << "dk";
  EXPECT_TRUE(all_close(got.dv, grad_to(rg.dv, batch, pr.v), gtol, gtol)) << "dv";
  EXPECT_EQ(got.dq.dtype(), dt);
}

}  // namespace

TEST(ScaledDotProductAttention, ForwardAndBackwardMatchReference) {
  const MaskKind kinds[] = {MaskKind::None, MaskKind::Causal, MaskKind::Bool, MaskKind::Additive};
  for (DType dt : {DType::f32, DType::f64, DType::bf16})
    for (MaskKind kind : kinds)
      for (int trial = 0; trial < 4; ++trial) check_against_reference(random_problem(kind, trial % 2 ? 0.3 : 0.0), dt);
}

// Causal problems longer than one block of query rows (64), with fewer and more keys than queries.
TEST(ScaledDotProductAttention, LongCausalRowsSkipOnlyKeysTheyCannotSee) {
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int64_t lk : {40, 150, 200}) {
      Problem pr;
      pr.batch = {2, 2};
      pr.q = {2, 2, 150, 8};
      pr.k = {2, 1, lk, 8};
      pr.v = {2, 2, lk, 5};
      pr.kind = MaskKind::Causal;
      pr.p = lk == 150 ? 0.2 : 0.0;
      check_against_reference(pr, dt);
    }
  }
}

TEST(ScaledDotProductAttention, MatchesTheUnfusedCompositionIncludingDropout) {
  const Tensor q = random_tensor({2, 3, 37, 16}, DType::f32, false, -2.0, 2.0);
  const Tensor k = random_tensor({2, 3, 41, 16}, DType::f32, false, -2.0, 2.0);
  const Tensor v = random_tensor({2, 3, 41, 16}, DType::f32, false, -2.0, 2.0);
  const Tensor g = random_tensor({2, 3, 37, 16});
  const Tensor pad = random_tensor({2, 1, 1, 41}, DType::f32, false, -3.0, 0.0);
  for (bool causal : {false, true}) {
    for (double p : {0.0, 0.1}) {
      SCOPED_TRACE(std::string(causal ? "causal" : "padding mask") + " p " + std::to_string(p));
      Problem pr;
      pr.kind = causal ? MaskKind::Causal : MaskKind::Additive;
      pr.p = p;
      const Tensor mask = causal ? Tensor() : pad;
      const GeneratorState st = default_generator().get_state();
      const Grads fused = run(q, k, v, mask, pr, g);
      default_generator().set_state(st);
      Tensor lq = q.detach().requires_grad_(), lk = k.detach().requires_grad_(), lv = v.detach().requires_grad_();
      Tensor m = mask;
      if (causal) {
        const Tensor rows = arange(0, 37.0, 1.0).view({37, 1}), cols = arange(0, 41.0, 1.0).view({1, 41});
        m = masked_fill(zeros({37, 41}), gt(cols, rows), -std::numeric_limits<double>::infinity());
      }
      const Tensor probs = scaled_masked_softmax(matmul(lq, lk.transpose(-2, -1)), m, 0.25, p, true);
      const Tensor y = matmul(probs, lv);
      y.backward(g);
      EXPECT_TRUE(all_close(fused.y, y.detach(), 1e-5, 1e-6)) << "forward";
      EXPECT_TRUE(all_close(fused.dq, lq.grad(), 1e-4, 1e-5)) << "dq";
      EXPECT_TRUE(all_close(fused.dk, lk.grad(), 1e-4, 1e-5)) << "dk";
      EXPECT_TRUE(all_close(fused.dv, lv.grad(), 1e-4, 1e-5)) << "dv";
    }
  }
}

// With uniform scores and v = 1 every output is (kept keys / S) / (1 - p): its mean over many
// rows is 1 and its spread that of a binomial; the same seed gives the same result, another seed
// another one.
TEST(ScaledDotProductAttention, DropoutKeepsTheExpectationAndFollowsTheSeed) {
  const int64_t rows = 4096, keys = 64;
  const double p = 0.25;
  const Tensor q = zeros({4, rows / 4, 8}), k = zeros({4, keys, 8}), v = ones({4, keys, 1});
  manual_seed(10);
  const Tensor a = scaled_dot_product_attention(q, k, v, Tensor(), p);
  manual_seed(10);
  const Tensor b = scaled_dot_product_attention(q, k, v, Tensor(), p);
  manual_seed(11);
  const Tensor c = scaled_dot_product_attention(q, k, v, Tensor(), p);
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  EXPECT_NE(a.to_vector<float>(), c.to_vector<float>());
  const std::vector<float> out = a.to_vector<float>();
  double mean = 0, var = 0;
  for (float x : out) mean += x;
  mean /= double(out.size());
  for (float x : out) var += (x - mean) * (x - mean);
  var /= double(out.size());
  // each row: Binomial(keys, 1 - p) / (keys (1 - p)); variance p / (keys (1 - p))
  const double want_var = p / (double(keys) * (1 - p));
  EXPECT_NEAR(mean, 1.0, 6 * std::sqrt(want_var / double(out.size())));
  EXPECT_NEAR(var, want_var, 0.2 * want_var);
}

TEST(ScaledDotProductAttention, Gradcheck) {
  const MaskKind kinds[] = {MaskKind::None, MaskKind::Causal, MaskKind::Bool, MaskKind::Additive};
  for (MaskKind kind : kinds) {
    for (double p : {0.0, 0.25}) {
      Problem pr = random_problem(kind, p, 4);
      SCOPED_TRACE(pr.describe());
      const Tensor mask = make_mask(pr);
      const Tensor m = mask.defined() && mask.dtype() != DType::boolean ? mask.to(DType::f64) : mask;
      expect_gradcheck(
          [&](const std::vector<Tensor>& in) {
            manual_seed(4);
            return std::vector<Tensor>{
                scaled_dot_product_attention(in[0], in[1], in[2], m, p, kind == MaskKind::Causal, 0.7)};
          },
          {random_tensor(pr.q, DType::f64).requires_grad_(), random_tensor(pr.k, DType::f64).requires_grad_(),
           random_tensor(pr.v, DType::f64).requires_grad_()});
    }
  }
}

TEST(ScaledDotProductAttention, ExplicitScaleAndEmptyKeys) {
  const Tensor q = random_tensor({2, 5, 4}), k = random_tensor({2, 6, 4}), v = random_tensor({2, 6, 3});
  const Tensor y = scaled_dot_product_attention(q, k, v, Tensor(), 0.0, false, 0.3);
  const RefTensor want = reference::scaled_dot_product_attention(reference::from_tensor(q), reference::from_tensor(k),
                                                                 reference::from_tensor(v), nullptr, false, 0.3,
                                                                 nullptr, 0.0);
  EXPECT_TRUE(all_close(y, want, 1e-5, 1e-5));
  const Tensor none = scaled_dot_product_attention(q, zeros({2, 0, 4}), zeros({2, 0, 3}));
  EXPECT_EQ(none.shape(), (Shape{2, 5, 3}));
  EXPECT_EQ(none.abs().sum().item<double>(), 0.0);
}

TEST(ScaledDotProductAttention, AutocastRunsInBf16AndSameResultsWhateverTheThreadCount) {
  Tensor q = random_tensor({2, 2, 24, 16}).requires_grad_();
  Tensor k = random_tensor({2, 2, 30, 16}).requires_grad_();
  Tensor v = random_tensor({2, 2, 30, 8}).requires_grad_();
  Tensor y;
  {
    AutocastGuard ag(DeviceType::CPU, DType::bf16);
    y = scaled_dot_product_attention(q, k, v, Tensor(), 0.1, true);
  }
  EXPECT_EQ(y.dtype(), DType::bf16);
  y.to(DType::f32).sum().backward();
  EXPECT_EQ(q.grad().dtype(), DType::f32);
  EXPECT_EQ(v.grad().dtype(), DType::f32);

  const Tensor x = random_tensor({4, 3, 70, 24});
  auto run_once = [&] {
    manual_seed(2);
    Tensor xl = x.detach().requires_grad_();
    Tensor out = scaled_dot_product_attention(xl, xl, xl, Tensor(), 0.2, true);
    out.backward(out.detach());
    return cat({out.detach().reshape({-1}), xl.grad().reshape({-1})});
  };
  auto [one, two] = with_one_and_two_threads(run_once);
  EXPECT_EQ(one.to_vector<float>(), two.to_vector<float>());
}

TEST(ScaledDotProductAttention, NativeF16RunsTheKernelsOnF32Copies) {
  // f16 has no kernel of Ember's own: without a library that takes it, native attention runs
  // the f32 kernels on widened copies (broadcast batch dims included) and rounds the results
  const Tensor q = random_tensor({2, 3, 9, 8}, DType::f16), k = random_tensor({1, 3, 11, 8}, DType::f16),
               v = random_tensor({2, 3, 11, 8}, DType::f16), g = random_tensor({2, 3, 9, 8}, DType::f16);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "plain");
    const native::AttentionResult half = native::scaled_dot_product_attention(q, k, v, Tensor(), causal, 0.4, 0.0);
    const native::AttentionResult wide = native::scaled_dot_product_attention(
        q.to(DType::f32), k.to(DType::f32), v.to(DType::f32), Tensor(), causal, 0.4, 0.0);
    EXPECT_EQ(half.out.dtype(), DType::f16);
    EXPECT_EQ(half.out.to(DType::f32).to_vector<float>(), wide.out.to(DType::f16).to(DType::f32).to_vector<float>());
    EXPECT_EQ(half.saved.stats.to_vector<float>(), wide.saved.stats.to_vector<float>());
    const native::AttentionGrads hg = native::scaled_dot_product_attention_backward(g, half.saved, 1.0);
    const native::AttentionGrads wg = native::scaled_dot_product_attention_backward(g.to(DType::f32), wide.saved, 1.0);
    for (auto [got, want] : {std::pair{hg.dq, wg.dq}, std::pair{hg.dk, wg.dk}, std::pair{hg.dv, wg.dv}}) {
      EXPECT_EQ(got.dtype(), DType::f16);
      EXPECT_EQ(got.to(DType::f32).to_vector<float>(), want.to(DType::f16).to(DType::f32).to_vector<float>());
    }
  }
}

TEST(ScaledDotProductAttention, BadArgumentsNameTheOpAndShapes) {
  const Tensor q = zeros({2, 3, 5, 4});
  EXPECT_EMBER_ERROR(scaled_dot_product_attention(q, zeros({2, 3, 6, 5}), zeros({2, 3, 6, 4})),
                     "scaled_dot_product_attention", "[2, 3, 5, 4]", "[2, 3, 6, 5]");
  EXPECT_EMBER_ERROR(scaled_dot_product_attention(q, zeros({2, 3, 6, 4}), zeros({2, 3, 7, 4})),
                     "scaled_dot_product_attention", "[2, 3, 6, 4]", "[2, 3, 7, 4]");
  EXPECT_EMBER_ERROR(scaled_dot_product_attention(q, zeros({3, 3, 6, 4}), zeros({3, 3, 6, 4})),
                     "scaled_dot_product_attention");
  EXPECT_EMBER_ERROR(scaled_dot_product_attention(q, q, q, zeros({5, 5}), 0.0, true), "scaled_dot_product_attention",
                     "not both");
  EXPECT_EMBER_ERROR(scaled_dot_product_attention(q, q, q, zeros({4, 5, 5})), "scaled_dot_product_attention",
                     "[4, 5, 5]", "[2, 3, 5, 5]");
  EXPECT_EMBER_ERROR(scaled_dot_product_attention(q, q.to(DType::f64), q), "scaled_dot_product_attention", "float64");
  EXPECT_EMBER_ERROR(scaled_dot_product_attention(zeros({4}), q, q), "scaled_dot_product_attention", "[4]");
  EXPECT_EMBER_ERROR(scaled_dot_product_attention(q, q, q, Tensor(), 1.5), "scaled_dot_product_attention", "1.5");
}
