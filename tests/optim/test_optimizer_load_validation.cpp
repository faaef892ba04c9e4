// Optimizer::load_state_dict and LRScheduler::load_state_dict validate the whole state dict
// before they change anything: a refused one leaves options, step counts and every state
// buffer bitwise as they were, and the error names the key.
#include <cmath>
#include <limits>

#include "bitwise_snapshot.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd_adam.h"
#include "test_util.h"

using namespace ember;
using ember::testing::scalars_bits;
using ember::testing::tensors_bytes;

namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// Two groups (2 + 1 parameters), stepped `steps` times so that every parameter has state.
struct Stepped {
  explicit Stepped(int steps, double lr = 0.1)
      : a(full({2, 3}, 0.5).requires_grad_()), b(full({3}, -0.5).requires_grad_()), c(full({4}, 1.5).requires_grad_()),
        opt({optim::ParamGroup{{a, b}, {}}, optim::ParamGroup{{c}, {{"lr", 0.05}}}}, {.lr = lr, .weight_decay = 0.01}) {
    for (int i = 0; i < steps; ++i) {
      a.set_grad(full(a.shape(), 0.1 * (i + 1)));
      b.set_grad(full(b.shape(), -0.2 * (i + 1)));
      c.set_grad(full(c.shape(), 0.3));
      opt.step();
    }
  }
  Tensor a, b, c;
  optim::AdamW opt;
};

// Everything a load could touch: options, steps and buffers (state_dict), and the parameters.
struct OptimizerSnapshot {
  explicit OptimizerSnapshot(const Stepped& s) {
    const auto sd = s.opt.state_dict();
    tensors = tensors_bytes(sd.tensors);
    scalars = scalars_bits(sd.scalars);
    params = tensors_bytes({{"a", s.a}, {"b", s.b}, {"c", s.c}});
  }
  bool operator==(const OptimizerSnapshot&) const = default;
  std::map<std::string, ember::testing::TensorBytes> tensors, params;
  std::map<std::string, uint64_t> scalars;
};

// A saved state from another run (other values everywhere), with a new lr in group 0: the
// old load wrote options before it checked the tensors.
optim::OptimizerStateDict saved_state() {
  Stepped other(3, /*lr=*/0.3);
  auto sd = other.opt.state_dict();
  sd.scalars["group.0.lr"] = 0.123;
  return sd;
}

void expect_refused_unchanged(const optim::OptimizerStateDict& sd, const std::vector<std::string>& fragments) {
  Stepped target(2);
  const OptimizerSnapshot before(target);
  try {
    target.opt.load_state_dict(sd);
    ADD_FAILURE() << "expected ember::Error";
  } catch (const Error& e) {
    for (const auto& f : fragments)
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << "message \"" << e.what() << "\" lacks \"" << f << "\"";
  }
  EXPECT_EQ(OptimizerSnapshot(target), before);
  EXPECT_EQ(target.opt.param_groups()[0].lr(), 0.1);
  EXPECT_NO_THROW(target.opt.validate_state_dict(target.opt.state_dict()));
}

}  // namespace

TEST(OptimizerLoadValidation, StateTensorOfTheWrongShapeChangesNothing) {
  auto sd = saved_state();
  sd.tensors["state.2.exp_avg_sq"] = zeros({7});
  expect_refused_unchanged(sd, {"AdamW.load_state_dict", "'state.2.exp_avg_sq'", "[7]", "[4]"});
}

TEST(OptimizerLoadValidation, StateTensorOfTheWrongDtypeOrUndefinedChangesNothing) {
  auto sd = saved_state();
  sd.tensors["state.1.exp_avg"] = zeros({3}, {.dtype = DType::i64});
  expect_refused_unchanged(sd, {"'state.1.exp_avg'", "int64", "float32"});
  sd = saved_state();
  sd.tensors["state.1.exp_avg"] = Tensor();
  expect_refused_unchanged(sd, {"'state.1.exp_avg'", "undefined"});
}

TEST(OptimizerLoadValidation, StepsMustBeNonNegativeIntegers) {
  for (double bad : {kNan, -1.0, 2.5, std::numeric_limits<double>::infinity()}) {
    auto sd = saved_state();
    sd.scalars["state.0.step"] = bad;
    expect_refused_unchanged(sd, {"'state.0.step'", "non-negative integer"});
  }
}

TEST(OptimizerLoadValidation, OptionsMustBeFiniteAndKnown) {
  auto sd = saved_state();
  sd.scalars["group.1.weight_decay"] = kNan;
  expect_refused_unchanged(sd, {"'group.1.weight_decay'", "nan", "finite"});
  sd = saved_state();
  sd.scalars["group.0.lr"] = -0.5;
  expect_refused_unchanged(sd, {"'group.0.lr'", "-0.5"});
  sd = saved_state();
  sd.scalars["group.0.momentum"] = 0.9;
  expect_refused_unchanged(sd, {"'group.0.momentum'", "not an option of AdamW"});
}

TEST(OptimizerLoadValidation, GroupsAndParameterCountsMustMatch) {
  auto sd = saved_state();
  sd.scalars["group.1.num_params"] = 2;
  expect_refused_unchanged(sd, {"group 1 has 1 parameters", "saved state has 2"});
  sd = saved_state();
  sd.scalars["group.2.num_params"] = 1;
  expect_refused_unchanged(sd, {"3 parameter groups", "this optimizer has 2"});
  sd = saved_state();
  sd.scalars.erase("group.1.num_params");
  expect_refused_unchanged(sd, {"1 parameter groups", "this optimizer has 2"});
}

TEST(OptimizerLoadValidation, KeysForUnknownParametersOrWithoutAStepAreRefused) {
  auto sd = saved_state();
  sd.tensors["state.3.exp_avg"] = zeros({4});
  sd.scalars["state.3.step"] = 1;
  expect_refused_unchanged(sd, {"'state.3.", "parameter 3", "has 3 parameters"});
  sd = saved_state();
  sd.scalars.erase("state.1.step");
  expect_refused_unchanged(sd, {"'state.1.exp_avg", "no 'state.1.step'"});
  sd = saved_state();
  sd.scalars["stats.0.step"] = 1;
  expect_refused_unchanged(sd, {"unexpected key 'stats.0.step'"});
}

TEST(OptimizerLoadValidation, AGoodStateStillLoadsAndConvertsFloatingDtypes) {
  auto sd = saved_state();
  for (auto& [k, t] : sd.tensors) t = t.to(DType::f64);
  Stepped target(2);
  target.opt.load_state_dict(sd);
  EXPECT_EQ(target.opt.param_groups()[0].lr(), 0.123);
  const auto loaded = target.opt.state_dict();
  EXPECT_EQ(loaded.scalars.at("state.0.step"), 3.0);
  EXPECT_EQ(loaded.tensors.at("state.2.exp_avg").dtype(), DType::f32);
  EXPECT_EQ(ember::testing::tensor_bytes(loaded.tensors.at("state.2.exp_avg")),
            ember::testing::tensor_bytes(sd.tensors.at("state.2.exp_avg").to(DType::f32)));
}

TEST(SchedulerLoadValidation, MissingOrBadStepChangesNothing) {
  Tensor w = zeros({1}).requires_grad_();
  optim::SGD opt({w}, {.lr = 1.0});
  auto s = optim::get_scheduler("linear", opt, 0, 10);
  for (int i = 0; i < 3; ++i) s->step();
  const uint64_t lr_before = ember::testing::double_bits(opt.param_groups()[0].lr());
  auto expect_unchanged = [&] {
    EXPECT_EQ(s->last_step(), 3);
    EXPECT_EQ(ember::testing::double_bits(opt.param_groups()[0].lr()), lr_before);
  };
  EXPECT_EMBER_ERROR(s->load_state_dict({}), "LRScheduler.load_state_dict", "missing 'step'");
  expect_unchanged();
  for (double bad : {-5.0, kNan, 1.5}) {
    EXPECT_EMBER_ERROR(s->load_state_dict({{"step", bad}}), "'step' is", "non-negative integer");
    expect_unchanged();
  }
  EXPECT_EMBER_ERROR(s->load_state_dict({{"step", 4.0}, {"warmup", 1.0}}), "unexpected key 'warmup'");
  expect_unchanged();
  EXPECT_EMBER_ERROR(s->validate_state_dict({{"step", -5.0}}), "'step' is -5");
  s->load_state_dict({{"step", 6.0}});
  EXPECT_EQ(s->last_step(), 6);
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].lr(), 0.4);
}
