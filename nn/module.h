// nn::Module: parameters, buffers and submodules under hierarchical names, as in PyTorch.
// Names join with '.', so a BERT parameter reads "bert.encoder.layer.0.attention.self.query.weight".
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/factory.h"
#include "core/ops.h"
#include "core/removable_handle.h"

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
  using ForwardPreHook = std::function<void(Module&)>;
  using ForwardHook = std::function<Tensor(Module&, const Tensor& output)>;

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
  // Puts `module` in the place of the child registered as `name` (same name, same position in
  // the order) and returns the old child. Sequential and ModuleList run the new child; a
  // module whose forward calls a child through a member of its own must re-point that member
  // in on_child_replaced, so any other module refuses (ember::Error naming it, nothing changed)
  // rather than go on running the old child. A plain Module holds nothing but the registry.
  std::shared_ptr<Module> replace_child(const std::string& name, std::shared_ptr<Module> module);

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

  // Forward hooks, run by the ForwardScope every Ember module's forward opens. A pre hook runs
  // before the forward's body; a post hook receives an output tensor and returns it unchanged
  // or a replacement (for example an identity carrying an autograd node), which the caller
  // then sees. Hooks run in registration order. A call runs the hooks registered when its
  // forward began: one registered from inside a hook first runs in the next call; one removed
  // through its handle (even from inside a hook) runs no more. Destroying the handle keeps the
  // hook registered. A post hook runs once for each output tensor the forward hands to its
  // scope's exit (a struct output names several; see ForwardScope). A forward that reads a
  // child's parameters directly (the fused BERT paths) runs none of that child's hooks.
  RemovableHandle register_forward_pre_hook(ForwardPreHook hook);
  RemovableHandle register_forward_hook(ForwardHook hook);
  // Pre hooks plus post hooks registered on this module (not its children).
  size_t forward_hook_count() const;
  // True while a forward of this module is running (between enter_forward and the scope's end).
  bool in_forward() const { return active_forwards_ > 0; }

  class ForwardScope;

  // Under mixed precision, models that opt in (the BERT heads) return their outputs in f32
  // while autocast is on, as Accelerate's convert_outputs_to_fp32 does for a prepared model.
  // Accelerator::prepare sets it when mixed_precision is fp16 or bf16.
  void set_convert_outputs_to_f32(bool on) { outputs_to_f32_ = on; }
  bool converts_outputs_to_f32() const { return outputs_to_f32_; }

 protected:
  // Opened first thing in every forward: `auto scope = enter_forward();` runs the pre hooks,
  // and `return scope.exit(out);` the post hooks. A forward that only calls another forward
  // overload of the same module opens no scope of its own, so hooks run once per call.
  ForwardScope enter_forward();
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  // replace_child asks before `module` takes `old`'s place under `name`: true when this module's
  // own references follow (it re-pointed them, or keeps none); false refuses the swap.
  virtual bool on_child_replaced(const std::string& name, const std::shared_ptr<Module>& old,
                                 const std::shared_ptr<Module>& module);
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
  struct PreHookEntry;
  struct PostHookEntry;
  struct HookTable;
  // Null until a hook is registered. Handles hold it weakly: one outliving its module removes
  // nothing.
  std::shared_ptr<HookTable> hooks_;
  int active_forwards_ = 0;
};

// The hooks of one forward call. Module::enter_forward builds it and runs the pre hooks; an
// exit form runs the post hooks on the output. Undefined tensors are passed through without
// running hooks. in_forward() holds from enter_forward (pre hooks included) until the scope is
// destroyed. When the forward (or a hook) throws, the destructor runs no post hooks and
// in_forward() returns to what it was, so the module stays usable. Exit at most once.
class Module::ForwardScope {
 public:
  ForwardScope(const ForwardScope&) = delete;
  ForwardScope& operator=(const ForwardScope&) = delete;
  ~ForwardScope();

  // The single output, after every post hook.
  Tensor exit(Tensor out);
  // Several outputs: the post hooks run on each tensor in turn (once per defined tensor).
  std::vector<Tensor> exit(std::vector<Tensor> outs);
  // A struct output: the post hooks run on each named member, in the order given, e.g.
  //   return scope.exit(std::move(out), &BertModelOutput::last_hidden_state, &BertModelOutput::pooler_output);
  template <typename T, typename... Members>
  T exit(T result, Members... members) {
    static_assert(sizeof...(Members) > 0, "ForwardScope::exit(result, &T::member...): name at least one member");
    static_assert((std::is_same_v<Members, Tensor T::*> && ...),
                  "ForwardScope::exit: members must be Tensor members of the result type");
    finish();
    ((result.*members = run_post(std::move(result.*members))), ...);
    return result;
  }

 private:
  friend class Module;
  explicit ForwardScope(Module& module);
  void finish();  // marks the scope exited; a second exit is an error
  Tensor run_post(Tensor out) const;

  Module& module_;
  std::vector<std::shared_ptr<PostHookEntry>> post_;  // the post hooks when the forward began
  bool exited_ = false;
};

// Whether a saved tensor of dtype `saved` can be loaded into one of dtype `target`: equal, or
// both floating (converted on load).
bool loadable_dtype(DType saved, DType target);

// Replaces the data behind `t` (storage, geometry, dtype) while keeping its identity, so every
// handle to it sees the change. Autograd state (grad) is dropped when the dtype changes.
void replace_data(Tensor& t, const Tensor& data);

}  // namespace ember::nn
