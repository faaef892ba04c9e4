// Post-accumulate-grad hooks and their handles: remove() unregisters a hook (once; again is
// harmless), destroying the handle keeps it, and hooks may remove hooks while they run.
#include "test_util.h"

#include <string>
#include <vector>

using namespace ember;

namespace {
Tensor leaf() { return from_vector<double>({1.0, 2.0}).requires_grad_(); }
void backward_through(const Tensor& w) { (w * 3.0).sum().backward(); }
}  // namespace

TEST(TensorHooks, RemovedHookNoLongerRunsAndRemovingTwiceIsHarmless) {
  Tensor w = leaf();
  std::vector<std::string> fired;
  RemovableHandle first = w.register_post_accumulate_grad_hook([&](const Tensor&) { fired.push_back("first"); });
  RemovableHandle second = w.register_post_accumulate_grad_hook([&](const Tensor&) { fired.push_back("second"); });
  EXPECT_EQ(w.hook_count(), 2u);
  backward_through(w);
  EXPECT_EQ(fired, (std::vector<std::string>{"first", "second"}));

  first.remove();
  EXPECT_EQ(w.hook_count(), 1u);
  first.remove();
  EXPECT_EQ(w.hook_count(), 1u);
  fired.clear();
  backward_through(w);
  EXPECT_EQ(fired, (std::vector<std::string>{"second"}));

  second.remove();
  EXPECT_EQ(w.hook_count(), 0u);
  fired.clear();
  backward_through(w);
  EXPECT_TRUE(fired.empty());
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{9.0, 9.0}));
}

TEST(TensorHooks, DestroyingTheHandleKeepsTheHook) {
  Tensor w = leaf();
  int runs = 0;
  { RemovableHandle h = w.register_post_accumulate_grad_hook([&](const Tensor&) { ++runs; }); }
  w.register_post_accumulate_grad_hook([&](const Tensor&) { ++runs; });  // handle discarded
  backward_through(w);
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(w.hook_count(), 2u);
}

TEST(TensorHooks, HooksMayRemoveHooksWhileTheyRun) {
  Tensor w = leaf();
  std::vector<std::string> fired;
  RemovableHandle self, later;
  self = w.register_post_accumulate_grad_hook([&](const Tensor&) {
    fired.push_back("once");
    self.remove();   // itself
    later.remove();  // one that has not run yet in this pass: it does not run
  });
  later = w.register_post_accumulate_grad_hook([&](const Tensor&) { fired.push_back("later"); });
  w.register_post_accumulate_grad_hook([&](const Tensor&) { fired.push_back("always"); });
  backward_through(w);
  EXPECT_EQ(fired, (std::vector<std::string>{"once", "always"}));
  backward_through(w);
  EXPECT_EQ(fired, (std::vector<std::string>{"once", "always", "always"}));
  EXPECT_EQ(w.hook_count(), 1u);
}

TEST(TensorHooks, RemovingAfterTheTensorIsGoneIsHarmless) {
  RemovableHandle h;
  h.remove();  // a default handle
  {
    Tensor w = leaf();
    h = w.register_post_accumulate_grad_hook([](const Tensor&) {});
    EXPECT_EQ(w.hook_count(), 1u);
  }
  h.remove();
  h.remove();
}

TEST(TensorHooks, EmptyHookIsAnError) {
  Tensor w = leaf();
  EXPECT_EMBER_ERROR(w.register_post_accumulate_grad_hook(nullptr), "register_post_accumulate_grad_hook",
                     "empty hook");
  EXPECT_EQ(w.hook_count(), 0u);
}
