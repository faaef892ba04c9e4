#include "optim/optimizer.h"

#include "core/grad_mode.h"

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

void Optimizer::load_state_dict(const OptimizerStateDict& sd) {
  int64_t index = 0;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    auto& g = groups_[gi];
    const std::string gp = "group." + std::to_string(gi) + ".";
    auto np = sd.scalars.find(gp + "num_params");
    EMBER_CHECK(np != sd.scalars.end(), name_, ".load_state_dict: the saved state has no parameter group ", gi,
                " (it was saved from an optimizer with fewer groups)");
    EMBER_CHECK(int64_t(np->second) == int64_t(g.params.size()), name_, ".load_state_dict: group ", gi, " has ",
                g.params.size(), " parameters but the saved state has ", int64_t(np->second));
    for (auto& [k, v] : g.options) {
      auto it = sd.scalars.find(gp + k);
      if (it != sd.scalars.end()) v = it->second;
    }
    for (const auto& p : g.params) {
      const std::string sp = "state." + std::to_string(index) + ".";
      auto st = sd.scalars.find(sp + "step");
      if (st != sd.scalars.end()) {
        ParamState ps;
        ps.step = int64_t(st->second);
        for (const auto& [key, t] : sd.tensors) {
          if (key.rfind(sp, 0) != 0) continue;
          EMBER_CHECK(t.shape() == p.shape(), name_, ".load_state_dict: state '", key, "' has shape ", t.shape(),
                      " but parameter ", index, " has shape ", p.shape());
          ps.buffers[key.substr(sp.size())] = t.to(p.device()).to(p.dtype()).contiguous().clone();
        }
        state_[p.impl()] = std::move(ps);
      } else {
        state_.erase(p.impl());
      }
      ++index;
    }
  }
  EMBER_CHECK(!sd.scalars.count("group." + std::to_string(groups_.size()) + ".num_params"), name_,
              ".load_state_dict: the saved state has more parameter groups than this optimizer");
}

}  // namespace ember::optim
