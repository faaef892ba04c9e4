#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/parallel_spin.h"
#include "core/usable_cpus.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define EMBER_CPU_RELAX() _mm_pause()
#else
#define EMBER_CPU_RELAX() ((void)0)
#endif

namespace ember {
namespace {

thread_local bool tls_in_parallel = false;

// How long a pool thread polls for its next job (a worker) or for the helpers to finish (the
// caller) before it sleeps. Waking a sleeping thread costs tens of microseconds on bare metal
// and often hundreds in a virtual machine whose idle virtual CPU the host has descheduled; in a
// BERT step about two thirds of the gaps between parallel regions last 25 us to 1 ms (the main
// thread's serial work between ops), so a 25 us poll left the worker asleep for 65-80% of the
// jobs. A millisecond bridges ~95% of the gaps and keeps a core spinning at most that long
// after the last op. Oversubscribed pools (more threads than CPUs this process may use) poll only briefly, as
// each spinning thread there takes a CPU from one with work.
constexpr int64_t kDefaultSpinMicroseconds = 1000;
constexpr int64_t kOversubscribedSpinMicroseconds = 20;
std::atomic<int64_t> g_spin_ns{kDefaultSpinMicroseconds * 1000};
std::atomic<int64_t> g_spin_override_us{-1};  // detail::set_spin_microseconds; -1: none
std::atomic<int64_t> g_wakeups{0};             // jobs published while a worker slept

// The budget for a pool of `threads`, in nanoseconds: set_spin_microseconds's, else
// EMBER_SPIN_US's, else by whether the threads oversubscribe the CPUs.
int64_t spin_budget_ns(int threads) {
  const int64_t forced = g_spin_override_us.load();
  if (forced >= 0) return forced * 1000;
  if (const char* s = std::getenv("EMBER_SPIN_US")) return detail::parse_spin_microseconds(s) * 1000;
  return (threads > usable_cpus() ? kOversubscribedSpinMicroseconds : kDefaultSpinMicroseconds) * 1000;
}

// Polls done() until it holds or the spin budget has passed; returns done()'s last value. The
// clock is read once every 64 pauses (the pause is ~13 ns on recent Intel cores, a few on
// older ones; a clock read a few tens). Past the first 50 us each round also yields, so a
// thread with work on this CPU (a data-loader worker, another process) runs first instead of
// sharing the CPU with a poll; with none, the yield returns at once and the CPU stays awake.
template <typename Done>
bool poll(const Done& done) {
  const int64_t budget = g_spin_ns.load(std::memory_order_relaxed);
  if (done()) return true;
  if (budget <= 0) return false;
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::nanoseconds(budget);
  const auto yield_from = start + std::chrono::microseconds(50);
  while (true) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      EMBER_CPU_RELAX();
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return done();
    if (now >= yield_from) std::this_thread::yield();
  }
}

// Synchronisation: a job is published by one seq_cst store of a word holding the job's sequence
// number and thread count (the job pointer and counters are written before it), so a spinning
// worker takes a job without touching a mutex. Mutexes and condition variables are used only
// when someone sleeps, and only after the sleeper has announced itself in an atomic counter
// (sleeping_workers_, caller_sleeping_) that the other side reads after its own seq_cst store:
// of the store and the check, each side sees the other's, so no wake-up is lost. Before this, a
// spinning worker that saw a new job blocked on the mutex the caller still held to publish it,
// and a caller that saw the job finished blocked on the mutex a worker held to signal it: one or
// two futex sleeps and wake-ups, tens of microseconds each in a virtual machine, per region.
//
// Each helper's share of a job is claimed before it runs, by the helper or, once the caller has
// run its own share, by the caller: a helper that is asleep or descheduled when the job comes
// (waking a thread on an idle virtual CPU took about 200 us on a busy KVM host, longer than a
// share of a typical op) no longer holds the op up; the caller runs its share too. Shares are
// the same calls whichever thread makes them, so results do not change.
class ThreadPool {
 public:
  explicit ThreadPool(int threads) { start(threads); }
  ~ThreadPool() { stop(); }

  int size() const { return int(workers_.size()) + 1; }

  void resize(int threads) {
    std::lock_guard<std::mutex> run(run_mu_);
    stop();
    start(threads);
  }

  // Runs job(t) for t in [0, nthreads) with the caller as thread 0. Returns false (running
  // nothing) when another thread holds the pool.
  bool run(int nthreads, const std::function<void(int)>& job) {
    std::unique_lock<std::mutex> run(run_mu_, std::try_to_lock);
    if (!run.owns_lock()) return false;
    nthreads = std::min(nthreads, size());
    // Every worker of the previous job has finished with job_ (remaining_ reached 0), and the
    // workers not in it never read job_, so these plain writes race with nothing.
    job_ = &job;
    remaining_.store(nthreads - 1, std::memory_order_relaxed);
    sequence_ += 1;
    publish(sequence_, nthreads);
    execute(job, 0);
    // the shares no helper has started yet
    for (int t = 1; t < nthreads; ++t)
      if (claim(t, sequence_)) {
        execute(job, t);
        remaining_.fetch_sub(1);
      }
    // Wait for the helpers: poll, then sleep.
    if (!poll([&] { return remaining_.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock<std::mutex> lock(mu_);
      caller_sleeping_.store(true);
      cv_done_.wait(lock, [&] { return remaining_.load() == 0; });
      caller_sleeping_.store(false, std::memory_order_relaxed);
    }
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
    return true;
  }

 private:
  // The published word: the job's sequence number above, its thread count in the low bits
  // (0: stop).
  static constexpr int kThreadBits = 16;
  static uint64_t word(uint64_t sequence, int nthreads) { return sequence << kThreadBits | uint64_t(nthreads); }
  static int threads_of(uint64_t w) { return int(w & ((uint64_t(1) << kThreadBits) - 1)); }
  static uint64_t sequence_of(uint64_t w) { return w >> kThreadBits; }

  // Whether this thread takes share t of job `sequence` (true for exactly one claimant). A share
  // is claimed by raising its slot to the job's sequence number: a late helper of a finished job
  // finds the slot at that job's number already and takes nothing.
  bool claim(int t, uint64_t sequence) {
    std::atomic<uint64_t>& slot = claimed_[size_t(t)];
    uint64_t old = slot.load(std::memory_order_relaxed);
    while (old < sequence && !slot.compare_exchange_weak(old, sequence)) {
    }
    return old < sequence;
  }

  // Makes word(sequence, nthreads) the current job and wakes the workers that sleep.
  void publish(uint64_t sequence, int nthreads) {
    current_.store(word(sequence, nthreads));
    if (sleeping_workers_.load() > 0) {
      if (nthreads > 0) g_wakeups.fetch_add(1, std::memory_order_relaxed);
      // A sleeper counted itself under mu_ and then checks current_ under mu_ before waiting:
      // taking mu_ here orders this notify after that check.
      { std::lock_guard<std::mutex> lock(mu_); }
      cv_start_.notify_all();
    }
  }

  void start(int threads) {
    EMBER_CHECK(threads < (1 << kThreadBits), "set_num_threads: at most ", (1 << kThreadBits) - 1, " threads");
    // Workers start from the current word: a job posted before a new thread first runs must
    // still count as new to it.
    const uint64_t seen = current_.load();
    claimed_ = std::vector<std::atomic<uint64_t>>(size_t(threads));
    for (auto& slot : claimed_) slot.store(sequence_, std::memory_order_relaxed);
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i, seen] { worker(i, seen); });
  }

  void stop() {
    sequence_ += 1;
    publish(sequence_, 0);
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  void execute(const std::function<void(int)>& job, int t) {
    tls_in_parallel = true;
    try {
      job(t);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu_);
      if (!error_) error_ = std::current_exception();
    }
    tls_in_parallel = false;
  }

  void worker(int id, uint64_t seen) {
    while (true) {
      uint64_t now = seen;
      if (!poll([&] { return (now = current_.load(std::memory_order_acquire)) != seen; })) {
        std::unique_lock<std::mutex> lock(mu_);
        sleeping_workers_.fetch_add(1);
        cv_start_.wait(lock, [&] { return (now = current_.load()) != seen; });
        sleeping_workers_.fetch_sub(1, std::memory_order_relaxed);
      }
      seen = now;
      const int nthreads = threads_of(now);
      if (nthreads == 0) return;
      if (id >= nthreads || !claim(id, sequence_of(now))) continue;
      // job_ was written before current_ (release, acquire above) and stays until remaining_ is
      // 0, which this share's count keeps from happening
      execute(*job_, id);
      if (remaining_.fetch_sub(1) == 1 && caller_sleeping_.load()) {
        std::lock_guard<std::mutex> lock(mu_);
        cv_done_.notify_one();
      }
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // one parallel region at a time
  std::mutex mu_;      // only for sleeping and waking
  std::condition_variable cv_start_, cv_done_;
  uint64_t sequence_ = 0;  // written under run_mu_ (or by the destructor)
  std::atomic<uint64_t> current_{0};
  std::atomic<int> remaining_{0};
  std::atomic<int> sleeping_workers_{0};
  std::atomic<bool> caller_sleeping_{false};
  std::vector<std::atomic<uint64_t>> claimed_;  // per share: the last job whose share was claimed
  const std::function<void(int)>* job_ = nullptr;
  std::mutex error_mu_;
  std::exception_ptr error_;
};

int default_threads() {
  if (const char* s = std::getenv("EMBER_NUM_THREADS")) {
    const int n = std::atoi(s);
    if (n > 0) return n;
  }
  const int hw = int(std::thread::hardware_concurrency());
  return hw > 0 ? hw : 1;
}

std::atomic<int> g_threads{default_threads()};

ThreadPool& pool() {
  // Leaked on purpose: worker threads must outlive static destructors that may still run ops.
  static ThreadPool* p = [] {
    g_spin_ns = spin_budget_ns(g_threads.load());  // a bad EMBER_SPIN_US fails here, before any thread
    return new ThreadPool(g_threads.load());
  }();
  return *p;
}

}  // namespace

void set_num_threads(int n) {
  EMBER_CHECK(n >= 1, "set_num_threads: expected a positive thread count, got ", n);
  EMBER_CHECK(!tls_in_parallel, "set_num_threads: cannot be called inside a parallel region");
  const int64_t budget = spin_budget_ns(n);
  g_threads = n;
  if (pool().size() != n) pool().resize(n);
  g_spin_ns = budget;
}

int get_num_threads() { return g_threads.load(std::memory_order_relaxed); }

bool in_parallel_region() { return tls_in_parallel; }

namespace detail {

int64_t parse_spin_microseconds(const char* text) {
  const std::string s = text ? text : "";
  const bool digits = !s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos;
  EMBER_CHECK(digits, "EMBER_SPIN_US: expected the microseconds a pool thread polls before sleeping, a whole number "
              "from 0 to 999999999, got '", s, "'");
  return std::stoll(s);
}

void set_spin_microseconds(int64_t us) {
  EMBER_CHECK(us >= -1, "set_spin_microseconds: expected microseconds >= 0, or -1 for the default, got ", us);
  g_spin_override_us = us;
  g_spin_ns = spin_budget_ns(pool().size());
}

int64_t spin_microseconds() {
  pool();  // the budget is chosen with the pool
  return g_spin_ns.load() / 1000;
}

int64_t pool_wakeups() { return g_wakeups.load(); }

void parallel_for_impl(int64_t begin, int64_t end, int64_t grain,
                       const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t n = end - begin;
  const int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(grain, 1));
  const int nthreads = int(std::min<int64_t>({int64_t(get_num_threads()), max_chunks, int64_t(pool().size())}));
  if (nthreads <= 1) {
    fn(begin, end);
    return;
  }
  const int64_t chunk = (n + nthreads - 1) / nthreads;
  const std::function<void(int)> job = [&](int t) {
    const int64_t b = begin + t * chunk, e = std::min(end, b + chunk);
    if (b < e) fn(b, e);
  };
  if (!pool().run(nthreads, job)) fn(begin, end);  // pool busy with another thread's op
}
}  // namespace detail

}  // namespace ember
