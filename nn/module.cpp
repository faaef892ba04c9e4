#include "nn/module.h"

#include <algorithm>
#include <sstream>
#include <typeinfo>

#include "core/autocast.h"
#include "core/grad_mode.h"
#include "core/sparse_grad.h"

namespace ember::nn {

std::string LoadReport::str() const {
  std::ostringstream os;
  auto list = [&](const char* what, const std::vector<std::string>& keys) {
    if (keys.empty()) return;
    os << what << " (" << keys.size() << "): ";
    for (size_t i = 0; i < keys.size(); ++i) os << (i ? ", " : "") << keys[i];
    os << ". ";
  };
  list("missing keys", missing_keys);
  list("unexpected keys", unexpected_keys);
  return os.str();
}

Tensor Module::forward(const Tensor&) {
  EMBER_FAIL(type_name_, ": this module has no single-tensor forward(); call its own forward signature");
}

namespace {
void check_name(const std::string& owner, const std::string& name) {
  EMBER_CHECK(!name.empty() && name.find('.') == std::string::npos, owner,
              ": invalid name '", name, "' (must be non-empty and contain no '.')");
}
template <typename V>
bool has_name(const V& v, const std::string& n) {
  return std::any_of(v.begin(), v.end(), [&](const auto& p) { return p.first == n; });
}
}  // namespace

Tensor& Module::register_parameter(const std::string& name, Tensor value, bool requires_grad) {
  check_name(type_name_, name);
  EMBER_CHECK(!has_name(params_, name) && !has_name(buffers_, name) && !has_name(children_, name),
              type_name_, ": '", name, "' is already registered");
  EMBER_CHECK(value.defined(), type_name_, ": parameter '", name, "' is undefined");
  if (requires_grad && !value.requires_grad()) value.requires_grad_(true);
  params_.emplace_back(name, value);
  return params_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor value, bool persistent) {
  check_name(type_name_, name);
  EMBER_CHECK(!has_name(params_, name) && !has_name(buffers_, name) && !has_name(children_, name),
              type_name_, ": '", name, "' is already registered");
  buffers_.emplace_back(name, value);
  if (!persistent) non_persistent_.push_back(name);
  return buffers_.back().second;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_name(type_name_, name);
  EMBER_CHECK(module != nullptr, type_name_, ": submodule '", name, "' is null");
  EMBER_CHECK(!has_name(params_, name) && !has_name(buffers_, name) && !has_name(children_, name),
              type_name_, ": '", name, "' is already registered");
  children_.emplace_back(name, std::move(module));
}

std::shared_ptr<Module> Module::replace_child(const std::string& name, std::shared_ptr<Module> module) {
  EMBER_CHECK(module != nullptr, type_name_, ": replace_child('", name, "'): the new module is null");
  auto slot = std::find_if(children_.begin(), children_.end(), [&](const auto& c) { return c.first == name; });
  EMBER_CHECK(slot != children_.end(), type_name_, ": replace_child: no child named '", name, "'");
  std::shared_ptr<Module> old = slot->second;
  if (old == module) return old;
  EMBER_CHECK(on_child_replaced(name, old, module), type_name_, ": cannot replace its child '", name, "' (",
              old->type_name(), "): its forward reaches the child through a member of its own; re-point that "
              "member in on_child_replaced, or build the module with the new child");
  slot->second = std::move(module);
  return old;
}

bool Module::on_child_replaced(const std::string&, const std::shared_ptr<Module>&, const std::shared_ptr<Module>&) {
  return typeid(*this) == typeid(Module);
}

void Module::collect(const std::string& prefix, bool params, bool recurse, bool dedupe, bool persistent_only,
                     std::vector<std::pair<std::string, Tensor>>& out,
                     std::vector<const TensorImpl*>& seen) const {
  for (const auto& [name, t] : params ? params_ : buffers_) {
    if (!t.defined()) continue;
    if (!params && persistent_only &&
        std::find(non_persistent_.begin(), non_persistent_.end(), name) != non_persistent_.end())
      continue;
    if (dedupe) {
      if (std::find(seen.begin(), seen.end(), t.impl()) != seen.end()) continue;
      seen.push_back(t.impl());
    }
    out.emplace_back(prefix + name, t);
  }
  if (!recurse) return;
  for (const auto& [name, child] : children_)
    child->collect(prefix + name + ".", params, true, dedupe, persistent_only, out, seen);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<const TensorImpl*> seen;
  collect("", true, recurse, true, false, out, seen);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<const TensorImpl*> seen;
  collect("", false, recurse, true, false, out, seen);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules(const std::string& prefix) {
  std::vector<std::pair<std::string, Module*>> out{{prefix, this}};
  for (auto& [name, child] : children_) {
    auto sub = child->named_modules(prefix.empty() ? name : prefix + "." + name);
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

Tensor Module::parameter(const std::string& dotted_name) const {
  std::vector<std::pair<std::string, Tensor>> all;
  std::vector<const TensorImpl*> seen;
  collect("", true, true, false, false, all, seen);
  for (auto& [n, t] : all)
    if (n == dotted_name) return t;
  EMBER_FAIL(type_name_, ": no parameter named '", dotted_name, "'");
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void replace_data(Tensor& t, const Tensor& data) {
  TensorImpl* impl = t.impl();
  const TensorImpl* src = data.impl();
  const bool dtype_changed = impl->dtype != src->dtype || impl->device() != src->device();
  impl->storage = src->storage;
  impl->offset = src->offset;
  impl->shape = src->shape;
  impl->strides = src->strides;
  impl->dtype = src->dtype;
  if (dtype_changed) impl->grad.reset();
}

void Module::to(DType dtype) {
  apply([dtype](Module& m) {
    for (auto* list : {&m.params_, &m.buffers_})
      for (auto& [n, t] : *list)
        if (t.defined() && is_floating(t.dtype()) && t.dtype() != dtype) {
          NoGradGuard ng;
          replace_data(t, t.detach().to(dtype));
        }
  });
}

void Module::to(Device device) {
  apply([device](Module& m) {
    for (auto* list : {&m.params_, &m.buffers_})
      for (auto& [n, t] : *list)
        if (t.defined() && t.device() != device) {
          NoGradGuard ng;
          replace_data(t, t.detach().to(device));
        }
  });
}

void Module::zero_grad(bool set_to_none) {
  for (auto& p : parameters()) {
    if (p.has_sparse_grad()) p.set_sparse_grad({});  // rows are dropped, never added to a table
    if (!p.grad().defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      NoGradGuard ng;
      p.grad().zero_();
    }
  }
}

void Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& [n, c] : children_) c->apply(fn);
  fn(*this);
}

StateDict Module::state_dict() const {
  StateDict out;
  std::vector<std::pair<std::string, Tensor>> all;
  std::vector<const TensorImpl*> seen;
  collect("", true, true, false, true, all, seen);
  collect("", false, true, false, true, all, seen);
  for (auto& [n, t] : all) out[n] = t.detach();
  return out;
}

bool loadable_dtype(DType saved, DType target) {
  return saved == target || (is_floating(saved) && is_floating(target));
}

LoadReport Module::validate_state_dict(const StateDict& state, bool strict) const {
  LoadReport report;
  const StateDict mine = state_dict();
  for (const auto& [name, t] : mine)
    if (!state.count(name)) report.missing_keys.push_back(name);
  for (const auto& [name, t] : state)
    if (!mine.count(name)) report.unexpected_keys.push_back(name);
  EMBER_CHECK(!strict || report.ok(), "load_state_dict (", type_name_, "): ", report.str());
  std::ostringstream mismatches;
  for (const auto& [name, dst] : mine) {
    auto it = state.find(name);
    if (it == state.end()) continue;
    const Tensor& src = it->second;
    if (!src.defined()) {
      mismatches << "; '" << name << "' is undefined in the checkpoint";
    } else if (src.shape() != dst.shape()) {
      mismatches << "; '" << name << "' has shape " << src.shape() << " in the checkpoint but " << dst.shape()
                 << " in the model";
    } else if (!loadable_dtype(src.dtype(), dst.dtype())) {
      mismatches << "; '" << name << "' has dtype " << src.dtype() << " in the checkpoint but " << dst.dtype()
                 << " in the model";
    }
  }
  const std::string found = mismatches.str();
  EMBER_CHECK(found.empty(), "load_state_dict (", type_name_, "): ", found.substr(2), " (nothing was loaded)");
  return report;
}

LoadReport Module::load_state_dict(const StateDict& state, bool strict) {
  LoadReport report = validate_state_dict(state, strict);
  NoGradGuard ng;
  for (auto& [name, dst] : state_dict()) {
    auto it = state.find(name);
    if (it != state.end()) dst.copy_(it->second);
  }
  return report;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& p : parameters()) n += p.numel();
  return n;
}

Tensor Module::model_output(const Tensor& t) const { return outputs_to_f32_ ? autocast::to_f32(t) : t; }

}  // namespace ember::nn
