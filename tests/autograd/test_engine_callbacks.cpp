// Callbacks queued during backward: run once per pass, after every gradient, in order, per thread.
#include <atomic>
#include <stdexcept>
#include <thread>

#include "autograd/engine.h"
#include "test_util.h"

using namespace ember;
using autograd::queue_callback;

namespace {
Tensor leaf(std::vector<double> v) { return from_vector<double>(v).requires_grad_(); }
}  // namespace

TEST(EngineCallbacks, RunOnceAfterEveryGradient) {
  Tensor a = leaf({1, 2}), b = leaf({3, 4});
  int calls = 0;
  bool saw_both = false;
  a.register_post_accumulate_grad_hook([&](const Tensor&) {
    queue_callback([&] {
      ++calls;
      // Both leaves are finished when the callback runs, whichever hook queued it.
      saw_both = a.grad().defined() && b.grad().defined();
    });
  });
  sum(a * b).backward();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(saw_both);
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{1, 2}));
  // Queued per pass: the next pass runs it again, once.
  sum(a * b).backward();
  EXPECT_EQ(calls, 2);
}

TEST(EngineCallbacks, RunInQueueOrderIncludingOnesQueuedByCallbacks) {
  Tensor a = leaf({1}), b = leaf({2});
  std::vector<std::string> order;
  a.register_post_accumulate_grad_hook([&](const Tensor&) {
    order.push_back("hook a");
    queue_callback([&] {
      order.push_back("cb 1");
      queue_callback([&] { order.push_back("cb 3 (from cb 1)"); });
    });
  });
  b.register_post_accumulate_grad_hook([&](const Tensor&) {
    order.push_back("hook b");
    queue_callback([&] { order.push_back("cb 2"); });
  });
  sum(a + b * 2.0).backward();
  ASSERT_EQ(order.size(), 5u);
  EXPECT_EQ(order[2], "cb 1");
  EXPECT_EQ(order[3], "cb 2");
  EXPECT_EQ(order[4], "cb 3 (from cb 1)");
  EXPECT_TRUE((order[0] == "hook a" && order[1] == "hook b") || (order[0] == "hook b" && order[1] == "hook a"));
}

TEST(EngineCallbacks, CallbacksSeeNoGradModeAndBackwardRunning) {
  Tensor a = leaf({1});
  bool grad_mode_seen = true, running_seen = false;
  a.register_post_accumulate_grad_hook([&](const Tensor&) {
    queue_callback([&] {
      grad_mode_seen = GradMode::is_enabled();
      running_seen = autograd::in_backward();
    });
  });
  EXPECT_FALSE(autograd::in_backward());
  sum(a * 3.0).backward();
  EXPECT_FALSE(grad_mode_seen);
  EXPECT_TRUE(running_seen);
  EXPECT_FALSE(autograd::in_backward());
}

TEST(EngineCallbacks, QueueOutsideBackwardIsAnError) {
  EXPECT_EMBER_ERROR(queue_callback([] {}), "queue_callback", "no backward pass");
  Tensor a = leaf({1});
  a.register_post_accumulate_grad_hook([](const Tensor&) { queue_callback(nullptr); });
  EXPECT_EMBER_ERROR(sum(a).backward(), "queue_callback", "empty");
}

TEST(EngineCallbacks, ExceptionInCallbackLeavesBackwardAndDropsTheRest) {
  Tensor a = leaf({1, 2});
  int later = 0;
  bool armed = true;
  a.register_post_accumulate_grad_hook([&](const Tensor&) {
    if (!armed) return;
    queue_callback([] { EMBER_FAIL("callback failed on purpose"); });
    queue_callback([&] { ++later; });
  });
  EXPECT_EMBER_ERROR(sum(a).backward(), "callback failed on purpose");
  EXPECT_EQ(later, 0);
  EXPECT_FALSE(autograd::in_backward());
  // Gradients were accumulated before the callbacks; the engine is usable afterwards.
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{1, 1}));
  armed = false;
  sum(a).backward();
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{2, 2}));

  // A non-ember exception propagates unchanged.
  Tensor b = leaf({1});
  b.register_post_accumulate_grad_hook([](const Tensor&) { queue_callback([] { throw std::runtime_error("plain"); }); });
  EXPECT_THROW(sum(b).backward(), std::runtime_error);
}

TEST(EngineCallbacks, FailedPassDropsItsCallbacks) {
  Tensor a = leaf({1}), b = leaf({2});
  int ran = 0;
  bool fail = true;
  // `a` accumulates first (queues a callback), then `b`'s hook throws and the pass fails.
  a.register_post_accumulate_grad_hook([&](const Tensor&) { queue_callback([&] { ++ran; }); });
  b.register_post_accumulate_grad_hook([&](const Tensor&) {
    if (fail) EMBER_FAIL("hook failed on purpose");
  });
  EXPECT_EMBER_ERROR(sum(a + b).backward(), "hook failed on purpose");
  EXPECT_EQ(ran, 0);
  EXPECT_FALSE(autograd::in_backward());
  fail = false;
  sum(a + b).backward();
  EXPECT_EQ(ran, 1);
}

TEST(EngineCallbacks, NestedBackwardKeepsItsOwnCallbacks) {
  Tensor a = leaf({1}), inner = leaf({5});
  std::vector<std::string> order;
  a.register_post_accumulate_grad_hook([&](const Tensor&) {
    queue_callback([&] { order.push_back("outer"); });
    // A backward started inside a hook is a pass of its own.
    Tensor y;
    {
      EnableGradGuard eg;
      y = sum(inner * 2.0);
    }
    inner.register_post_accumulate_grad_hook([&](const Tensor&) {
      queue_callback([&] { order.push_back("inner"); });
    });
    y.backward();
  });
  sum(a).backward();
  EXPECT_EQ(order, (std::vector<std::string>{"inner", "outer"}));
  EXPECT_EQ(inner.grad().to_vector<double>(), (std::vector<double>{2}));
}

TEST(EngineCallbacks, ConcurrentBackwardsOnThreadsAreIndependent) {
  constexpr int kThreads = 4, kPasses = 25;
  std::atomic<int> wrong_thread{0};
  std::vector<int> counts(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Tensor a = leaf({1, 2, 3});
      const auto me = std::this_thread::get_id();
      a.register_post_accumulate_grad_hook([&, t, me](const Tensor&) {
        queue_callback([&, t, me] {
          if (std::this_thread::get_id() != me) wrong_thread++;
          counts[t]++;
        });
      });
      for (int i = 0; i < kPasses; ++i) sum(a * a).backward();
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong_thread.load(), 0);
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(counts[t], kPasses) << "thread " << t;
}
