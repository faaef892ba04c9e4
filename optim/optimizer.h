// Optimizer base: parameter groups with per-group options, per-parameter state, state_dict.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ember::optim {

struct ParamGroup {
  std::vector<Tensor> params;
  std::map<std::string, double> options;  // overrides of the optimizer defaults ("lr", "weight_decay", ...)
  double& lr() { return options.at("lr"); }
  double get(const std::string& key) const;
};

struct ParamState {
  int64_t step = 0;
  std::map<std::string, Tensor> buffers;  // e.g. exp_avg, exp_avg_sq, momentum_buffer
};

// Flat, serialisable form: tensors "state.<param index>.<buffer>" and scalars
// "state.<param index>.step", "group.<g>.<option>", "group.<g>.num_params".
struct OptimizerStateDict {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, double> scalars;
};

class Optimizer {
 public:
  Optimizer(std::string name, std::vector<ParamGroup> groups, std::map<std::string, double> defaults);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual void step() = 0;
  // step() restricted to `params` (those of its groups that are listed; the rest are left
  // alone, state included): how data parallel updates one bucket as soon as its gradients are
  // reduced. An optimizer whose step is not per parameter would need its own.
  void step_only(const std::vector<Tensor>& params);
  void zero_grad(bool set_to_none = true);
  void add_param_group(ParamGroup group);
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  ParamState& state(const Tensor& param);
  const std::string& name() const { return name_; }

  OptimizerStateDict state_dict() const;
  // Restores state saved from an optimizer over the same parameters in the same order. The
  // whole dict is checked first (validate_state_dict): a refused one changes nothing.
  void load_state_dict(const OptimizerStateDict& sd);
  // Raises ember::Error naming the key when `sd` does not fit this optimizer, changing nothing:
  // another number of parameter groups or of parameters in a group, a key it does not know, an
  // option that is not finite (or a negative lr), a step that is not a non-negative integer, a
  // state tensor without its step, or one whose shape differs from its parameter's or whose
  // dtype cannot be converted to it (floating into floating only).
  void validate_state_dict(const OptimizerStateDict& sd) const;

 protected:
  std::string name_;
  std::vector<ParamGroup> groups_;
  std::map<std::string, double> defaults_;
  std::map<const TensorImpl*, ParamState> state_;
};

std::vector<ParamGroup> single_group(const std::vector<Tensor>& params);

}  // namespace ember::optim
