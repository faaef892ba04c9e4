// The thread pool: coverage of every index, nesting, exceptions, resizing, concurrent callers,
// helpers that wake late, how long workers poll before sleeping.
#include <atomic>
#include <chrono>
#include <thread>

#include "core/parallel_spin.h"
#include "test_util.h"

using namespace ember;

namespace {

// Sets the pool's polling time for one test and restores the default when the test ends, also
// when an assertion ends it early.
class SpinBudget {
 public:
  explicit SpinBudget(int64_t us) { detail::set_spin_microseconds(us); }
  void set(int64_t us) { detail::set_spin_microseconds(us); }
  ~SpinBudget() { detail::set_spin_microseconds(-1); }
  SpinBudget(const SpinBudget&) = delete;
  SpinBudget& operator=(const SpinBudget&) = delete;
};

}  // namespace

TEST(Parallel, EveryIndexRunsExactlyOnce) {
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    std::vector<std::atomic<int>> hits(10007);
    parallel_for(0, 10007, 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1) << threads << " threads";
  }
  set_num_threads(2);
}

TEST(Parallel, SharesRunExactlyOnceWhenHelpersWakeLate) {
  // Pauses longer than the workers' polling put them to sleep, so jobs often reach them late: the
  // caller then takes their shares, and a helper that wakes after its job is done must take
  // nothing, of that job or of the next. Jobs of two and of three shares alternate, so the third
  // worker sits some out. The counts are checked after the last job and a pause, so a share run
  // a second time after its job returned is counted too.
  constexpr int kRounds = 300;
  set_num_threads(3);
  const SpinBudget spin(20);
  std::vector<std::atomic<int>> hits(kRounds * 3);
  for (int round = 0; round < kRounds; ++round) {
    if (round % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    std::atomic<int>* h = hits.data() + round * 3;
    parallel_for(0, round % 2 ? 2 : 3, 1, [h](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) h[i]++;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (int round = 0; round < kRounds; ++round)
    for (int i = 0; i < 3; ++i)
      ASSERT_EQ(hits[size_t(round * 3 + i)].load(), i < (round % 2 ? 2 : 3) ? 1 : 0)
          << "round " << round << " index " << i;
  set_num_threads(2);
}

// Runs `jobs` two-share jobs, each after a pause of `pause_us` on the calling thread, and returns
// how many of them had to wake a sleeping worker.
int64_t wakeups_over(int jobs, int pause_us) {
  const int64_t before = detail::pool_wakeups();
  std::atomic<int64_t> items{0};
  for (int j = 0; j < jobs; ++j) {
    std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
    parallel_for(0, 2, 1, [&](int64_t b, int64_t e) { items += e - b; });
  }
  EXPECT_EQ(items.load(), 2 * jobs);
  return detail::pool_wakeups() - before;
}

TEST(Parallel, WorkersPollForTheirBudgetBeforeSleeping) {
  set_num_threads(2);
  // no polling: a worker sleeps as soon as its share is done, so jobs after a pause wake it
  SpinBudget spin(0);
  parallel_for(0, 2, 1, [](int64_t, int64_t) {});
  EXPECT_GE(wakeups_over(40, 300), 20);
  // a budget far longer than the pauses: once its poll has begun, the worker never sleeps
  spin.set(5'000'000);
  parallel_for(0, 2, 1, [](int64_t, int64_t) {});  // wakes the worker, which then polls
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(wakeups_over(40, 300), 0);
  // back to the default; one more job ends the worker's long poll
  spin.set(-1);
  parallel_for(0, 2, 1, [](int64_t, int64_t) {});
}

TEST(Parallel, SpinBudgetTextIsCheckedAndNamed) {
  EXPECT_EQ(detail::parse_spin_microseconds("0"), 0);
  EXPECT_EQ(detail::parse_spin_microseconds("1000"), 1000);
  EXPECT_EQ(detail::parse_spin_microseconds("999999999"), 999999999);
  for (const char* bad : {"", "-1", "1e3", "abc", " 5", "5 ", "1000000000", "0x10"}) {
    try {
      detail::parse_spin_microseconds(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("EMBER_SPIN_US"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(detail::set_spin_microseconds(-2), Error);
}

TEST(Parallel, ResizingRepeatedlyNeverLosesAJob) {
  // A job posted right after the pool is rebuilt must reach the fresh workers.
  for (int round = 0; round < 200; ++round) {
    set_num_threads(1);
    set_num_threads(2);
    std::atomic<int64_t> total{0};
    parallel_for(0, 1000, 1, [&](int64_t b, int64_t e) { total += e - b; });
    ASSERT_EQ(total.load(), 1000) << "round " << round;
  }
}

TEST(Parallel, NestedCallsRunInlineAndExceptionsPropagate) {
  set_num_threads(2);
  std::atomic<int> inner{0};
  parallel_for(0, 4, 1, [&](int64_t b, int64_t e) {
    EXPECT_TRUE(in_parallel_region());
    parallel_for(0, 10, 1, [&](int64_t b2, int64_t e2) { inner += int(e2 - b2); });
  });
  EXPECT_EQ(inner.load(), 20);
  EXPECT_FALSE(in_parallel_region());
  EXPECT_EMBER_ERROR(parallel_for(0, 100, 1,
                                  [&](int64_t b, int64_t e) {
                                    if (b > 0) throw Error("chunk failed at " + std::to_string(b));
                                  }),
                     "chunk failed");
  // the pool still works afterwards
  std::atomic<int> n{0};
  parallel_for(0, 100, 1, [&](int64_t b, int64_t e) { n += int(e - b); });
  EXPECT_EQ(n.load(), 100);
  EXPECT_EMBER_ERROR(set_num_threads(0), "set_num_threads");
}

TEST(Parallel, ConcurrentCallersFromSeveralThreadsAllFinish) {
  set_num_threads(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t)
    callers.emplace_back([&] {
      for (int r = 0; r < 50; ++r) parallel_for(0, 1000, 10, [&](int64_t b, int64_t e) { total += e - b; });
    });
  for (auto& c : callers) c.join();
  EXPECT_EQ(total.load(), 4 * 50 * 1000);
}
