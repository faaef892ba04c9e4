#include "nn/layers/containers.h"

#include <string>

namespace ember::nn {

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) : Module("Sequential") {
  for (auto& m : modules) push_back(std::move(m));
}

void Sequential::push_back(std::shared_ptr<Module> m) {
  register_module(std::to_string(items_.size()), m);
  items_.push_back(std::move(m));
}

Tensor Sequential::forward(const Tensor& x) {
  auto scope = enter_forward();
  Tensor h = x;
  for (auto& m : items_) h = m->forward(h);
  return scope.exit(h);
}

namespace {
// The items mirror the registry: item i is the child named "i".
bool replace_item(std::vector<std::shared_ptr<Module>>& items, const std::string& name,
                  const std::shared_ptr<Module>& old, const std::shared_ptr<Module>& module) {
  const auto index = size_t(std::stoull(name));
  if (index >= items.size() || items[index] != old) return false;
  items[index] = module;
  return true;
}
}  // namespace

bool Sequential::on_child_replaced(const std::string& name, const std::shared_ptr<Module>& old,
                                   const std::shared_ptr<Module>& module) {
  return replace_item(items_, name, old, module);
}

void ModuleList::push_back(std::shared_ptr<Module> m) {
  register_module(std::to_string(items_.size()), m);
  items_.push_back(std::move(m));
}

std::shared_ptr<Module> ModuleList::operator[](size_t i) const {
  EMBER_CHECK(i < items_.size(), "ModuleList: index ", i, " out of range for ", items_.size(), " modules");
  return items_[i];
}

bool ModuleList::on_child_replaced(const std::string& name, const std::shared_ptr<Module>& old,
                                   const std::shared_ptr<Module>& module) {
  return replace_item(items_, name, old, module);
}

}  // namespace ember::nn
