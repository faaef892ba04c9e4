// Sequential and ModuleList.
#pragma once
#include "nn/module.h"

namespace ember::nn {

// Chains single-tensor modules; children are named "0", "1", ... as in PyTorch.
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules);
  void push_back(std::shared_ptr<Module> m);
  Tensor forward(const Tensor& x) override;
  size_t size() const { return items_.size(); }
  std::shared_ptr<Module> operator[](size_t i) const { return items_.at(i); }

 protected:
  bool on_child_replaced(const std::string& name, const std::shared_ptr<Module>& old,
                         const std::shared_ptr<Module>& module) override;

 private:
  std::vector<std::shared_ptr<Module>> items_;
};

// Holds submodules by index; forward is the caller's loop.
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  void push_back(std::shared_ptr<Module> m);
  size_t size() const { return items_.size(); }
  std::shared_ptr<Module> operator[](size_t i) const;
  template <typename M>
  std::shared_ptr<M> at(size_t i) const {
    auto p = std::dynamic_pointer_cast<M>((*this)[i]);
    EMBER_CHECK(p != nullptr, "ModuleList: item ", i, " is a ", (*this)[i]->type_name(), ", not the requested type");
    return p;
  }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 protected:
  bool on_child_replaced(const std::string& name, const std::shared_ptr<Module>& old,
                         const std::shared_ptr<Module>& module) override;

 private:
  std::vector<std::shared_ptr<Module>> items_;
};

}  // namespace ember::nn
