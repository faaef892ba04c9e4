// nn::Module: parameters, buffers and submodules under hierarchical names, as in PyTorch.
// Names join with '.', so a BERT parameter reads "bert.encoder.layer.0.attention.self.query.weight".
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/factory.h"
#include "core/ops.h"

namespace ember::nn {

using StateDict = std::map<std::string, Tensor>;

struct LoadReport {
  std::vector<std::string> missing_keys;     // expected by the module, absent from the dict
  std::vector<std::string> unexpected_keys;  // in the dict, unknown to the module
  bool ok() const { return missing_keys.empty() && unexpected_keys.empty(); }
  std::string str() const;
};

class Module {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& type_name() const { return type_name_; }

  // The single-tensor forward used by Sequential; modules with richer signatures add their own.
  virtual Tensor forward(const Tensor& x);

  // Registration (returns the stored handle). Parameters are leaves that require grad.
  Tensor& register_parameter(const std::string& name, Tensor value, bool requires_grad = true);
  Tensor& register_buffer(const std::string& name, Tensor value, bool persistent = true);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  // Parameters in registration order, depth first; a parameter shared by two modules
  // (tied weights) is listed once, under its first name.
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const { return children_; }
  std::vector<std::pair<std::string, Module*>> named_modules(const std::string& prefix = "");

  Tensor parameter(const std::string& dotted_name) const;  // throws when absent

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Moves/casts parameters and buffers in place: handles held elsewhere (an optimizer) see
  // the new data. Floating tensors only are cast by to(DType), like PyTorch.
  void to(DType dtype);
  void to(Device device);
  void zero_grad(bool set_to_none = true);
  void apply(const std::function<void(Module&)>& fn);

  // Every parameter and persistent buffer, by full name (tied weights appear under each name).
  StateDict state_dict() const;
  // Copies values in. Every key, shape and dtype is checked before anything is copied, so a
  // refused dict leaves the module untouched: shapes must match, and a dtype must match unless
  // both are floating (then it is converted). strict: missing or unexpected keys are an
  // ember::Error listing them; otherwise they are returned in the report.
  LoadReport load_state_dict(const StateDict& state, bool strict = true);
  // The checks of load_state_dict alone: raises the same ember::Error (naming every key whose
  // shape or dtype does not fit), changes nothing, and returns the key report.
  LoadReport validate_state_dict(const StateDict& state, bool strict = true) const;

  int64_t num_parameters() const;

  // Under mixed precision, models that opt in (the BERT heads) return their outputs in f32
  // while autocast is on, as Accelerate's convert_outputs_to_fp32 does for a prepared model.
  // Accelerator::prepare sets it when mixed_precision is fp16 or bf16.
  void set_convert_outputs_to_f32(bool on) { outputs_to_f32_ = on; }
  bool converts_outputs_to_f32() const { return outputs_to_f32_; }

 protected:
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  // `t` as this module's caller should see it: f32 when set_convert_outputs_to_f32 is on and
  // autocast is active, else unchanged.
  Tensor model_output(const Tensor& t) const;

 private:
  void collect(const std::string& prefix, bool params, bool recurse, bool dedupe, bool persistent_only,
               std::vector<std::pair<std::string, Tensor>>& out, std::vector<const TensorImpl*>& seen) const;

  std::string type_name_;
  bool training_ = true;
  bool outputs_to_f32_ = false;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::string> non_persistent_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

// Whether a saved tensor of dtype `saved` can be loaded into one of dtype `target`: equal, or
// both floating (converted on load).
bool loadable_dtype(DType saved, DType target);

// Replaces the data behind `t` (storage, geometry, dtype) while keeping its identity, so every
// handle to it sees the change. Autograd state (grad) is dropped when the dtype changes.
void replace_data(Tensor& t, const Tensor& data);

}  // namespace ember::nn
