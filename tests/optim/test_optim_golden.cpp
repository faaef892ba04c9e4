// Optimizers, LR schedulers and gradient clipping against PyTorch and Hugging Face transformers:
// trajectories recorded by tests/golden/make_optim_golden.py (see tests/golden/README.md) in
// tests/golden/optim/optim_golden.json. The gradients of every step are part of the file, so
// Ember is fed exactly what torch was fed; no Python is needed to run this.
//
// Errors are measured per tensor as max |actual - expected| / max |expected|; the limits are
// 1e-12 in float64 and 1e-6 in float32 (rounding-order differences only).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <memory>
#include <tuple>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "optim/clip_grad.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd_adam.h"
#include "test_util.h"

using namespace ember;
using Json = nlohmann::json;

namespace {

const Json& golden() {
  static const Json j = [] {
    const std::string path = std::string(EMBER_SOURCE_DIR) + "/tests/golden/optim/optim_golden.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    std::stringstream text;
    text << in.rdbuf();
    return Json::parse(text.str());
  }();
  return j;
}

DType dtype_named(const std::string& name) { return name == "float64" ? DType::f64 : DType::f32; }
double tolerance_for(DType dtype) { return dtype == DType::f64 ? 1e-12 : 1e-6; }

Shape shape_of(const Json& j) { return j.get<std::vector<int64_t>>(); }

Tensor tensor_from(const Json& values, const Json& shape, DType dtype) {
  return from_vector(values.get<std::vector<double>>(), shape_of(shape)).to(dtype);
}

// max |actual - expected| / max |expected| (absolute when expected is all zero).
::testing::AssertionResult matches(const std::string& what, const Tensor& actual, const Json& expected, double tol) {
  if (!actual.defined()) return ::testing::AssertionFailure() << what << ": undefined tensor";
  const std::vector<double> a = actual.to_vector<double>();
  const std::vector<double> e = expected.get<std::vector<double>>();
  if (a.size() != e.size())
    return ::testing::AssertionFailure() << what << ": " << a.size() << " elements, golden has " << e.size();
  double scale = 0.0, worst = 0.0;
  size_t at = 0;
  for (double v : e) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < e.size(); ++i) {
    const double d = std::abs(a[i] - e[i]);
    if (!(d <= worst)) {
      worst = d;
      at = i;
    }
  }
  const double rel = worst / (scale > 0 ? scale : 1.0);
  if (rel <= tol) return ::testing::AssertionSuccess();
  std::ostringstream msg;
  msg.precision(17);
  msg << what << ": max |diff| / max |golden| = " << rel << " > " << tol << " (element " << at << ": " << a[at]
      << " vs golden " << e[at] << ")";
  return ::testing::AssertionFailure() << msg.str();
}

const Json& find_case(const char* section, const std::string& name, const std::string& dtype) {
  for (const Json& c : golden().at(section))
    if (c.at("name") == name && c.at("dtype") == dtype) return c;
  throw std::runtime_error(std::string("golden file lacks ") + section + " case " + name + " / " + dtype);
}

double option(const Json& opts, const char* key, double fallback) {
  return opts.contains(key) ? opts.at(key).get<double>() : fallback;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const Json& c, const std::vector<Tensor>& params) {
  const Json& o = c.at("options");
  std::vector<optim::ParamGroup> groups;
  if (c.contains("group_overrides")) {
    for (size_t i = 0; i < params.size(); ++i) {
      optim::ParamGroup g{{params[i]}, {}};
      for (const auto& [k, v] : c.at("group_overrides")[i].items()) g.options[k] = v.get<double>();
      groups.push_back(g);
    }
  } else {
    groups = optim::single_group(params);
  }
  const std::string kind = c.at("optimizer");
  if (kind == "SGD") {
    optim::SGDOptions d;
    return std::make_unique<optim::SGD>(
        groups, optim::SGDOptions{.lr = option(o, "lr", d.lr),
                                  .momentum = option(o, "momentum", d.momentum),
                                  .dampening = option(o, "dampening", d.dampening),
                                  .weight_decay = option(o, "weight_decay", d.weight_decay),
                                  .nesterov = o.value("nesterov", d.nesterov)});
  }
  if (kind == "Adam") {
    optim::AdamOptions d;
    return std::make_unique<optim::Adam>(groups, optim::AdamOptions{.lr = option(o, "lr", d.lr),
                                                                    .beta1 = option(o, "beta1", d.beta1),
                                                                    .beta2 = option(o, "beta2", d.beta2),
                                                                    .eps = option(o, "eps", d.eps),
                                                                    .weight_decay = option(o, "weight_decay", 0.0)});
  }
  if (kind == "AdamW") {
    // torch.optim.AdamW's default weight decay is 0.01, as Ember's.
    optim::AdamWOptions d;
    return std::make_unique<optim::AdamW>(groups,
                                          optim::AdamWOptions{.lr = option(o, "lr", d.lr),
                                                              .beta1 = option(o, "beta1", d.beta1),
                                                              .beta2 = option(o, "beta2", d.beta2),
                                                              .eps = option(o, "eps", d.eps),
                                                              .weight_decay = option(o, "weight_decay", 0.01)});
  }
  throw std::runtime_error("unknown optimizer " + kind);
}

// ---------------------------------------------------------------- optimizer trajectories

using OptimizerCase = std::tuple<std::string, std::string>;  // case name, dtype

class OptimizerGolden : public ::testing::TestWithParam<OptimizerCase> {};

TEST_P(OptimizerGolden, TrajectoryMatchesTorch) {
  const auto& [name, dtype_name] = GetParam();
  const Json& c = find_case("optimizers", name, dtype_name);
  const DType dtype = dtype_named(dtype_name);
  const double tol = tolerance_for(dtype);
  std::vector<Tensor> params;
  for (size_t i = 0; i < c.at("shapes").size(); ++i)
    params.push_back(tensor_from(c.at("initial")[i], c.at("shapes")[i], dtype).requires_grad_());
  auto opt = make_optimizer(c, params);
  std::unique_ptr<optim::LRScheduler> sched;
  if (c.contains("schedule")) {
    const Json& s = c.at("schedule");
    sched = optim::get_scheduler(s.at("name"), *opt, s.at("warmup"), s.at("total"));
  }
  const size_t steps = c.at("grads").size();
  ASSERT_EQ(steps, 10u);
  for (size_t step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step + 1));
    for (size_t g = 0; g < opt->param_groups().size(); ++g)
      EXPECT_NEAR(opt->param_groups()[g].get("lr"), c.at("lr_used")[step][g].get<double>(), 1e-15) << "group " << g;
    for (size_t i = 0; i < params.size(); ++i)
      params[i].set_grad(tensor_from(c.at("grads")[step][i], c.at("shapes")[i], dtype));
    opt->step();
    if (sched) sched->step();
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_EQ(params[i].dtype(), dtype);
      ASSERT_TRUE(matches("param " + std::to_string(i), params[i], c.at("params")[step][i], tol));
    }
  }
  for (const auto& [key, per_param] : c.at("final_state").items()) {
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& buffers = opt->state(params[i]).buffers;
      auto it = buffers.find(key);
      ASSERT_NE(it, buffers.end()) << "no optimizer state " << key << " for param " << i;
      EXPECT_TRUE(matches(key + " of param " + std::to_string(i), it->second, per_param[i], tol));
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<OptimizerCase>& info) {
  return std::get<0>(info.param) + "_" + std::get<1>(info.param);
}

INSTANTIATE_TEST_SUITE_P(Torch, OptimizerGolden,
                         ::testing::Combine(::testing::Values("sgd_plain", "sgd_momentum_dampening", "sgd_nesterov",
                                                              "adam", "adam_l2", "adam_betas_eps", "adamw",
                                                              "adamw_two_groups", "adamw_linear_schedule"),
                                            ::testing::Values("float64", "float32")),
                         case_name);

// ---------------------------------------------------------------- LR schedulers

TEST(SchedulerGolden, MatchesTransformersGetScheduler) {
  const Json& cases = golden().at("schedulers");
  std::set<std::string> names;
  for (const Json& c : cases) {
    const std::string name = c.at("name");
    names.insert(name);
    SCOPED_TRACE(name + " power " + std::to_string(c.at("power").get<double>()));
    const double base_lr = c.at("base_lr");
    Tensor p = zeros({1}).requires_grad_();
    optim::SGD opt({p}, {.lr = base_lr});
    auto sched = optim::get_scheduler(name, opt, c.at("warmup"), c.at("total"), c.at("lr_end"), c.at("power"));
    const std::vector<double> expected = c.at("lrs");
    ASSERT_EQ(expected.size(), 25u);
    for (size_t step = 0; step < expected.size(); ++step) {
      if (step > 0) sched->step();
      EXPECT_EQ(sched->last_step(), int64_t(step));
      const double lr = sched->get_last_lr().at(0);
      EXPECT_NEAR(lr, expected[step], 1e-12 * base_lr) << "after " << step << " scheduler steps";
      EXPECT_EQ(opt.param_groups()[0].get("lr"), lr);
    }
  }
  EXPECT_EQ(names, (std::set<std::string>{"linear", "cosine", "polynomial", "constant_with_warmup", "constant"}));
}

// ---------------------------------------------------------------- gradient clipping

class ClipGradNormGolden : public ::testing::TestWithParam<std::string> {};

// Norm 2 and inf, with a max_norm that clips and one that does not.
TEST_P(ClipGradNormGolden, MatchesTorchClipGradNorm) {
  const std::string dtype_name = GetParam();
  int seen = 0;
  for (const Json& c : golden().at("clip_grad_norm")) {
    if (c.at("dtype") != dtype_name) continue;
    ++seen;
    const bool inf_norm = c.at("norm_type") == "inf";
    const double norm_type = inf_norm ? std::numeric_limits<double>::infinity() : c.at("norm_type").get<double>();
    const double max_norm = c.at("max_norm");
    SCOPED_TRACE("norm " + (inf_norm ? std::string("inf") : std::to_string(norm_type)) + " max_norm " +
                 std::to_string(max_norm));
    const DType dtype = dtype_named(dtype_name);
    const double tol = tolerance_for(dtype);
    std::vector<Tensor> params;
    for (size_t i = 0; i < c.at("shapes").size(); ++i) {
      Tensor p = zeros(shape_of(c.at("shapes")[i]), {dtype}).requires_grad_();
      p.set_grad(tensor_from(c.at("grads")[i], c.at("shapes")[i], dtype));
      params.push_back(p);
    }
    const double total = optim::clip_grad_norm_(params, max_norm, norm_type);
    const double expected_total = c.at("total_norm");
    EXPECT_LE(std::abs(total - expected_total), tol * expected_total)
        << "total norm " << total << " vs torch " << expected_total;
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(params[i].grad().dtype(), dtype);
      EXPECT_TRUE(matches("clipped grad " + std::to_string(i), params[i].grad(), c.at("clipped")[i], tol));
    }
  }
  EXPECT_EQ(seen, 4);
}

INSTANTIATE_TEST_SUITE_P(Torch, ClipGradNormGolden, ::testing::Values("float64", "float32"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
