#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_set>
#include <utility>

#include "core/grad_mode.h"
#include "core/sparse_grad.h"

namespace ember::optim {

double ParamGroup::get(const std::string& key) const {
  auto it = options.find(key);
  EMBER_CHECK(it != options.end(), "optimizer: parameter group has no option '", key, "'");
  return it->second;
}

std::vector<ParamGroup> single_group(const std::vector<Tensor>& params) { return {ParamGroup{params, {}}}; }

Optimizer::Optimizer(std::string name, std::vector<ParamGroup> groups, std::map<std::string, double> defaults)
    : name_(std::move(name)), defaults_(std::move(defaults)) {
  for (auto& g : groups) add_param_group(std::move(g));
}

void Optimizer::add_param_group(ParamGroup group) {
  EMBER_CHECK(!group.params.empty(), name_, ": a parameter group needs at least one parameter");
  for (const auto& [k, v] : group.options)
    EMBER_CHECK(defaults_.count(k), name_, ": unknown option '", k, "' in a parameter group");
  for (const auto& [k, v] : defaults_) group.options.emplace(k, v);
  for (const auto& p : group.params) {
    EMBER_CHECK(p.defined() && p.is_leaf() && p.requires_grad(), name_,
                ": can only optimize leaf tensors that require grad");
    for (const auto& g : groups_)
      for (const auto& q : g.params)
        EMBER_CHECK(!q.is_same(p), name_, ": a parameter appears in more than one parameter group");
  }
  groups_.push_back(std::move(group));
}

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard ng;
  for (auto& g : groups_)
    for (auto& p : g.params) {
      if (p.has_sparse_grad()) {
        Tensor h = p;
        h.set_sparse_grad({});  // rows are dropped, never added to a table
      }
      if (!p.grad().defined()) continue;
      if (set_to_none) {
        Tensor h = p;
        h.set_grad(Tensor());
      } else {
        p.grad().zero_();
      }
    }
}

ParamState& Optimizer::state(const Tensor& param) { return state_[param.impl()]; }

OptimizerStateDict Optimizer::state_dict() const {
  OptimizerStateDict sd;
  int64_t index = 0;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const auto& g = groups_[gi];
    const std::string gp = "group." + std::to_string(gi) + ".";
    for (const auto& [k, v] : g.options) sd.scalars[gp + k] = v;
    sd.scalars[gp + "num_params"] = double(g.params.size());
    for (const auto& p : g.params) {
      auto it = state_.find(p.impl());
      if (it != state_.end()) {
        const std::string sp = "state." + std::to_string(index) + ".";
        sd.scalars[sp + "step"] = double(it->second.step);
        for (const auto& [name, t] : it->second.buffers) sd.tensors[sp + name] = t;
      }
      ++index;
    }
  }
  return sd;
}

namespace {

// A key of the flat state dict: "<kind>.<index>.<rest>".
struct StateKey {
  std::string kind;
  int64_t index = -1;
  std::string rest;
};

std::optional<StateKey> parse_key(const std::string& key) {
  const size_t a = key.find('.');
  if (a == std::string::npos) return std::nullopt;
  const size_t b = key.find('.', a + 1);
  if (b == std::string::npos || b == a + 1 || b + 1 == key.size()) return std::nullopt;
  const std::string digits = key.substr(a + 1, b - a - 1);
  if (digits.size() > 12 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return StateKey{key.substr(0, a), std::stoll(digits), key.substr(b + 1)};
}

bool is_count(double v) { return std::isfinite(v) && v >= 0 && v == std::floor(v) && v < 9.0e15; }

bool is_floating_or_same(DType saved, DType target) {
  return saved == target || (is_floating(saved) && is_floating(target));
}

}  // namespace

void Optimizer::validate_state_dict(const OptimizerStateDict& sd) const {
  const std::string who = name_ + ".load_state_dict";
  size_t saved_groups = 0;
  while (sd.scalars.count("group." + std::to_string(saved_groups) + ".num_params")) ++saved_groups;
  EMBER_CHECK(saved_groups == groups_.size(), who, ": the saved state has ", saved_groups,
              " parameter groups but this optimizer has ", groups_.size());
  std::vector<const Tensor*> params;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const double n = sd.scalars.at("group." + std::to_string(gi) + ".num_params");
    EMBER_CHECK(is_count(n) && int64_t(n) == int64_t(groups_[gi].params.size()), who, ": group ", gi, " has ",
                groups_[gi].params.size(), " parameters but the saved state has ", n,
                " ('group.", gi, ".num_params')");
    for (const auto& p : groups_[gi].params) params.push_back(&p);
  }
  for (const auto& [key, v] : sd.scalars) {
    const auto k = parse_key(key);
    EMBER_CHECK(k && (k->kind == "group" || k->kind == "state"), who, ": unexpected key '", key, "'");
    if (k->kind == "group") {
      EMBER_CHECK(size_t(k->index) < groups_.size(), who, ": unexpected key '", key, "' (there are ", groups_.size(),
                  " parameter groups)");
      if (k->rest == "num_params") continue;
      EMBER_CHECK(groups_[size_t(k->index)].options.count(k->rest), who, ": '", key, "' is not an option of ",
                  name_);
      EMBER_CHECK(std::isfinite(v), who, ": '", key, "' is ", v, ", expected a finite number");
      EMBER_CHECK(k->rest != "lr" || v >= 0, who, ": '", key, "' is ", v, ", expected a learning rate >= 0");
    } else {
      EMBER_CHECK(k->rest == "step", who, ": unexpected key '", key, "' (per-parameter scalars are 'step' only)");
      EMBER_CHECK(size_t(k->index) < params.size(), who, ": '", key, "' is for parameter ", k->index,
                  " but this optimizer has ", params.size(), " parameters");
      EMBER_CHECK(is_count(v), who, ": '", key, "' is ", v, ", expected a non-negative integer");
    }
  }
  for (const auto& [key, t] : sd.tensors) {
    const auto k = parse_key(key);
    EMBER_CHECK(k && k->kind == "state", who, ": unexpected tensor '", key, "'");
    EMBER_CHECK(size_t(k->index) < params.size(), who, ": state '", key, "' is for parameter ", k->index,
                " but this optimizer has ", params.size(), " parameters");
    EMBER_CHECK(sd.scalars.count("state." + std::to_string(k->index) + ".step"), who, ": state '", key,
                "' has no 'state.", k->index, ".step'");
    const Tensor& p = *params[size_t(k->index)];
    EMBER_CHECK(t.defined(), who, ": state '", key, "' is undefined");
    EMBER_CHECK(t.shape() == p.shape(), who, ": state '", key, "' has shape ", t.shape(), " but parameter ",
                k->index, " has shape ", p.shape());
    EMBER_CHECK(is_floating_or_same(t.dtype(), p.dtype()), who, ": state '", key, "' has dtype ", t.dtype(),
                " but parameter ", k->index, " has dtype ", p.dtype());
  }
}

void Optimizer::load_state_dict(const OptimizerStateDict& sd) {
  validate_state_dict(sd);
  // Built aside first, so that nothing changes unless all of it could be made.
  std::vector<std::map<std::string, double>> options;
  std::map<const TensorImpl*, ParamState> state;
  int64_t index = 0;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const std::string gp = "group." + std::to_string(gi) + ".";
    auto opts = groups_[gi].options;
    for (auto& [k, v] : opts) {
      auto it = sd.scalars.find(gp + k);
      if (it != sd.scalars.end()) v = it->second;
    }
    options.push_back(std::move(opts));
    for (const auto& p : groups_[gi].params) {
      const std::string sp = "state." + std::to_string(index++) + ".";
      auto st = sd.scalars.find(sp + "step");
      if (st == sd.scalars.end()) continue;
      ParamState ps;
      ps.step = int64_t(st->second);
      for (auto it = sd.tensors.lower_bound(sp); it != sd.tensors.end() && it->first.rfind(sp, 0) == 0; ++it)
        ps.buffers[it->first.substr(sp.size())] = it->second.to(p.device()).to(p.dtype()).contiguous().clone();
      state[p.impl()] = std::move(ps);
    }
  }
  for (size_t gi = 0; gi < groups_.size(); ++gi) groups_[gi].options = std::move(options[gi]);
  for (const auto& g : groups_)
    for (const auto& p : g.params) state_.erase(p.impl());
  state_.merge(state);
}

void Optimizer::step_only(const std::vector<Tensor>& params) {
  std::unordered_set<const TensorImpl*> wanted;
  for (const Tensor& p : params) wanted.insert(p.impl());
  std::vector<std::vector<Tensor>> all;
  all.reserve(groups_.size());
  for (ParamGroup& g : groups_) {
    std::vector<Tensor> some;
    for (const Tensor& p : g.params)
      if (wanted.count(p.impl())) some.push_back(p);
    all.push_back(std::exchange(g.params, std::move(some)));
  }
  try {
    step();
  } catch (...) {
    for (size_t k = 0; k < groups_.size(); ++k) groups_[k].params = std::move(all[k]);
    throw;
  }
  for (size_t k = 0; k < groups_.size(); ++k) groups_[k].params = std::move(all[k]);
}

}  // namespace ember::optim
