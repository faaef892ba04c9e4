// Module's forward hooks and the ForwardScope that runs them.
#include <algorithm>
#include <utility>

#include "nn/module.h"

namespace ember::nn {

// `removed` lets a call skip a hook removed after the call took its list.
struct Module::PreHookEntry {
  uint64_t id;
  ForwardPreHook fn;
  bool removed = false;
};

struct Module::PostHookEntry {
  uint64_t id;
  ForwardHook fn;
  bool removed = false;
};

struct Module::HookTable {
  std::vector<std::shared_ptr<PreHookEntry>> pre;
  std::vector<std::shared_ptr<PostHookEntry>> post;
  uint64_t next_id = 0;
};

namespace {

template <typename Entry>
void remove_entry(std::vector<std::shared_ptr<Entry>>& list, uint64_t id) {
  auto it = std::find_if(list.begin(), list.end(), [id](const auto& e) { return e->id == id; });
  if (it == list.end()) return;
  (*it)->removed = true;
  list.erase(it);
}

}  // namespace

RemovableHandle Module::register_forward_pre_hook(ForwardPreHook hook) {
  EMBER_CHECK(hook != nullptr, type_name_, ": register_forward_pre_hook: empty hook");
  if (!hooks_) hooks_ = std::make_shared<HookTable>();
  const uint64_t id = hooks_->next_id++;
  hooks_->pre.push_back(std::make_shared<PreHookEntry>(PreHookEntry{id, std::move(hook)}));
  std::weak_ptr<HookTable> weak = hooks_;
  return RemovableHandle([weak, id] {
    if (auto table = weak.lock()) remove_entry(table->pre, id);
  });
}

RemovableHandle Module::register_forward_hook(ForwardHook hook) {
  EMBER_CHECK(hook != nullptr, type_name_, ": register_forward_hook: empty hook");
  if (!hooks_) hooks_ = std::make_shared<HookTable>();
  const uint64_t id = hooks_->next_id++;
  hooks_->post.push_back(std::make_shared<PostHookEntry>(PostHookEntry{id, std::move(hook)}));
  std::weak_ptr<HookTable> weak = hooks_;
  return RemovableHandle([weak, id] {
    if (auto table = weak.lock()) remove_entry(table->post, id);
  });
}

size_t Module::forward_hook_count() const { return hooks_ ? hooks_->pre.size() + hooks_->post.size() : 0; }

Module::ForwardScope Module::enter_forward() { return ForwardScope(*this); }

Module::ForwardScope::ForwardScope(Module& module) : module_(module) {
  ++module.active_forwards_;
  HookTable* table = module.hooks_.get();
  if (!table || (table->pre.empty() && table->post.empty())) return;
  post_ = table->post;
  // A copy: a hook may register or remove hooks while the list is walked.
  const auto pre = table->pre;
  try {
    for (const auto& h : pre)
      if (!h->removed) h->fn(module);
  } catch (...) {
    --module.active_forwards_;  // a constructor that throws gets no destructor call
    throw;
  }
}

Module::ForwardScope::~ForwardScope() { --module_.active_forwards_; }

void Module::ForwardScope::finish() {
  EMBER_CHECK(!exited_, module_.type_name(), ": forward scope exited twice");
  exited_ = true;
}

Tensor Module::ForwardScope::run_post(Tensor out) const {
  if (!out.defined()) return out;
  for (const auto& h : post_) {
    if (h->removed) continue;
    out = h->fn(module_, out);
    EMBER_CHECK(out.defined(), module_.type_name(), ": a forward hook returned an undefined tensor (return the "
                "output it was given to leave it unchanged)");
  }
  return out;
}

Tensor Module::ForwardScope::exit(Tensor out) {
  finish();
  return run_post(std::move(out));
}

std::vector<Tensor> Module::ForwardScope::exit(std::vector<Tensor> outs) {
  finish();
  for (Tensor& t : outs) t = run_post(std::move(t));
  return outs;
}

}  // namespace ember::nn
