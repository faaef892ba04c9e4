// The handle a hook registration returns. remove() unregisters the hook; destroying the handle
// leaves it registered, as with PyTorch's RemovableHandle. Removing twice, or after the object
// the hook was registered on is gone, does nothing.
#pragma once
#include <functional>
#include <utility>

namespace ember {

class RemovableHandle {
 public:
  RemovableHandle() = default;
  // `remover` unregisters the hook; it runs at most once per handle.
  explicit RemovableHandle(std::function<void()> remover) : remover_(std::move(remover)) {}
  void remove() {
    std::function<void()> remover = std::move(remover_);
    remover_ = nullptr;
    if (remover) remover();
  }

 private:
  std::function<void()> remover_;
};

}  // namespace ember
