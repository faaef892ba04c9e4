// Optimizers, schedulers and clipping against closed-form trajectories computed here in double.
#include <cmath>

#include "optim/clip_grad.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd_adam.h"
#include "test_util.h"

using namespace ember;

namespace {
// Quadratic loss sum(0.5 * a * p^2) has gradient a * p: easy to follow by hand.
void set_quadratic_grad(Tensor& p, const std::vector<double>& a) {
  auto v = p.to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i) v[i] *= a[i];
  p.set_grad(from_vector(v, p.shape(), {p.dtype()}));
}
}  // namespace

TEST(Optim, AdamWFollowsTheClosedFormTrajectory) {
  const std::vector<double> a = {1.0, -2.0, 0.5, 3.0};
  std::vector<double> p = {0.5, -1.0, 2.0, 0.1}, m(4, 0), v(4, 0);
  Tensor t = from_vector(p, {4}).requires_grad_();
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  optim::AdamW opt({t}, {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd});
  for (int step = 1; step <= 5; ++step) {
    set_quadratic_grad(t, a);
    opt.step();
    for (size_t i = 0; i < 4; ++i) {
      const double g = a[i] * p[i];
      p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double mh = m[i] / (1 - std::pow(b1, step)), vh = v[i] / (1 - std::pow(b2, step));
      p[i] -= lr * mh / (std::sqrt(vh) + eps);
    }
    auto got = t.to_vector<double>();
    for (size_t i = 0; i < 4; ++i) ASSERT_NEAR(got[i], p[i], 1e-12) << "step " << step << " i " << i;
  }
  EXPECT_EQ(opt.state(t).step, 5);
}

TEST(Optim, AdamAppliesL2ToTheGradient) {
  Tensor t = from_vector<double>({1.0}).requires_grad_();
  optim::Adam opt({t}, {.lr = 0.1, .weight_decay = 0.5});
  t.set_grad(from_vector<double>({0.0}));
  opt.step();
  // g = 0 + 0.5 * 1 = 0.5; first Adam step moves by lr * sign(g) (bias-corrected m/sqrt(v) = 1)
  EXPECT_NEAR(t.item<double>(), 1.0 - 0.1 * 0.5 / (0.5 + 1e-8), 1e-9);
}

TEST(Optim, SgdMomentumAndNesterov) {
  for (bool nesterov : {false, true}) {
    std::vector<double> p = {1.0, -2.0}, buf(2, 0);
    const std::vector<double> a = {0.5, 1.5};
    Tensor t = from_vector(p, {2}).requires_grad_();
    const double lr = 0.1, mom = 0.9, wd = 0.01;
    optim::SGD opt({t}, {.lr = lr, .momentum = mom, .weight_decay = wd, .nesterov = nesterov});
    for (int step = 0; step < 4; ++step) {
      set_quadratic_grad(t, a);
      opt.step();
      for (size_t i = 0; i < 2; ++i) {
        double d = a[i] * p[i] + wd * p[i];
        buf[i] = step == 0 ? d : mom * buf[i] + d;
        d = nesterov ? d + mom * buf[i] : buf[i];
        p[i] -= lr * d;
      }
      auto got = t.to_vector<double>();
      for (size_t i = 0; i < 2; ++i) ASSERT_NEAR(got[i], p[i], 1e-12) << "nesterov " << nesterov;
    }
  }
  Tensor t = zeros({1}).requires_grad_();
  EXPECT_EMBER_ERROR(optim::SGD({t}, {.lr = 0.1, .nesterov = true}), "Nesterov");
}

TEST(Optim, ParamGroupsAndStateDictRoundTrip) {
  Tensor w = from_vector<float>({1, 2}).requires_grad_(), b = from_vector<float>({3}).requires_grad_();
  optim::AdamW opt({optim::ParamGroup{{w}, {}}, optim::ParamGroup{{b}, {{"weight_decay", 0.0}, {"lr", 0.5}}}},
                   {.lr = 0.1, .weight_decay = 0.01});
  EXPECT_EQ(opt.param_groups()[0].get("weight_decay"), 0.01);
  EXPECT_EQ(opt.param_groups()[1].get("lr"), 0.5);
  for (int i = 0; i < 3; ++i) {
    w.set_grad(ones({2}));
    b.set_grad(ones({1}));
    opt.step();
  }
  auto sd = opt.state_dict();
  EXPECT_EQ(sd.scalars.at("state.0.step"), 3.0);
  EXPECT_TRUE(sd.tensors.count("state.1.exp_avg_sq"));
  // A fresh optimizer restored from the state continues exactly like the original.
  Tensor w2 = w.detach().clone().requires_grad_(), b2 = b.detach().clone().requires_grad_();
  optim::AdamW opt2({optim::ParamGroup{{w2}, {}}, optim::ParamGroup{{b2}, {{"weight_decay", 0.0}, {"lr", 0.5}}}},
                    {.lr = 0.1, .weight_decay = 0.01});
  opt2.load_state_dict(sd);
  w.set_grad(ones({2}));
  b.set_grad(ones({1}));
  w2.set_grad(ones({2}));
  b2.set_grad(ones({1}));
  opt.step();
  opt2.step();
  EXPECT_EQ(w.to_vector<float>(), w2.to_vector<float>());
  EXPECT_EQ(b.to_vector<float>(), b2.to_vector<float>());
  // Mismatched models are refused with a clear message.
  Tensor z = zeros({5}).requires_grad_();
  optim::AdamW other({z}, {});
  EXPECT_EMBER_ERROR(other.load_state_dict(sd), "load_state_dict");
  EXPECT_EMBER_ERROR(optim::AdamW({optim::ParamGroup{{w}, {{"momentum", 0.9}}}}, {}), "unknown option 'momentum'");
  EXPECT_EMBER_ERROR(optim::AdamW({optim::ParamGroup{{w}, {}}, optim::ParamGroup{{w}, {}}}, {}), "more than one");
}

TEST(Optim, ZeroGradSetsToNone) {
  Tensor w = zeros({2}).requires_grad_();
  optim::SGD opt({w}, {.lr = 0.1});
  w.set_grad(ones({2}));
  opt.zero_grad();
  EXPECT_FALSE(w.grad().defined());
  w.set_grad(ones({2}));
  opt.zero_grad(false);
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{0, 0}));
}

TEST(Schedulers, MatchTransformersFormulas) {
  Tensor w = zeros({1}).requires_grad_();
  auto lrs = [&](const std::string& name) {
    optim::SGD opt({w}, {.lr = 1.0});
    auto s = optim::get_scheduler(name, opt, 2, 10);
    std::vector<double> out;
    for (int i = 0; i <= 10; ++i) {
      out.push_back(opt.param_groups()[0].lr());
      s->step();
    }
    return out;
  };
  const auto lin = lrs("linear");
  EXPECT_DOUBLE_EQ(lin[0], 0.0);
  EXPECT_DOUBLE_EQ(lin[1], 0.5);
  EXPECT_DOUBLE_EQ(lin[2], 1.0);
  EXPECT_DOUBLE_EQ(lin[6], 0.5);
  EXPECT_DOUBLE_EQ(lin[10], 0.0);
  const auto cos = lrs("cosine");
  EXPECT_DOUBLE_EQ(cos[2], 1.0);
  EXPECT_NEAR(cos[6], 0.5, 1e-12);
  EXPECT_NEAR(cos[10], 0.0, 1e-12);
  const auto cst = lrs("constant_with_warmup");
  EXPECT_DOUBLE_EQ(cst[1], 0.5);
  EXPECT_DOUBLE_EQ(cst[9], 1.0);
  EXPECT_DOUBLE_EQ(lrs("constant")[0], 1.0);
  const auto poly = lrs("polynomial");  // power 1, lr_end 1e-7: linear down to lr_end
  EXPECT_NEAR(poly[6], (1.0 - 1e-7) * 0.5 + 1e-7, 1e-12);
  optim::SGD opt({w}, {.lr = 1.0});
  EXPECT_EMBER_ERROR(optim::get_scheduler("exponential", opt, 0, 10), "unknown scheduler");
}

TEST(Schedulers, StateRoundTrip) {
  Tensor w = zeros({1}).requires_grad_();
  optim::SGD opt({w}, {.lr = 1.0});
  auto s = optim::get_scheduler("linear", opt, 0, 10);
  for (int i = 0; i < 4; ++i) s->step();
  auto sd = s->state_dict();
  optim::SGD opt2({w}, {.lr = 1.0});
  auto s2 = optim::get_scheduler("linear", opt2, 0, 10);
  s2->load_state_dict(sd);
  EXPECT_DOUBLE_EQ(opt2.param_groups()[0].lr(), opt.param_groups()[0].lr());
  EXPECT_DOUBLE_EQ(opt2.param_groups()[0].lr(), 0.6);
}

TEST(Clipping, NormIsReturnedAndGradientsScaled) {
  Tensor a = zeros({2}).requires_grad_(), b = zeros({1}).requires_grad_();
  a.set_grad(from_vector<float>({3, 0}));
  b.set_grad(from_vector<float>({4}));
  const double norm = optim::clip_grad_norm_({a, b}, 1.0);
  EXPECT_NEAR(norm, 5.0, 1e-6);
  EXPECT_NEAR(a.grad().to_vector<float>()[0], 0.6, 1e-5);
  EXPECT_NEAR(b.grad().to_vector<float>()[0], 0.8, 1e-5);
  // infinity norm
  a.set_grad(from_vector<float>({-7, 1}));
  EXPECT_NEAR(optim::clip_grad_norm_({a, b}, 100.0, INFINITY), 7.0, 1e-6);
  // non-finite norms: returned as is, or an error on request
  a.set_grad(from_vector<float>({NAN, 1}));
  EXPECT_TRUE(std::isnan(optim::clip_grad_norm_({a, b}, 1.0)));
  EXPECT_EMBER_ERROR(optim::clip_grad_norm_({a, b}, 1.0, 2.0, true), "clip_grad_norm_", "nan");
  a.set_grad(from_vector<float>({-7, 1}));
  optim::clip_grad_value_({a}, 2.0);
  EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{-2, 1}));
}
