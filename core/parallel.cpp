#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define EMBER_CPU_RELAX() _mm_pause()
#else
#define EMBER_CPU_RELAX() ((void)0)
#endif

namespace ember {
namespace {

thread_local bool tls_in_parallel = false;

// ~30 us of polling before sleeping: long enough to bridge consecutive ops, short enough
// not to matter to a neighbour.
constexpr int kSpinIterations = 2000;

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
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      job_threads_ = nthreads;
      remaining_.store(nthreads - 1, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_start_.notify_all();
    execute(job, 0);
    // Wait for the helpers: poll, then sleep.
    for (int i = 0; i < kSpinIterations && remaining_.load(std::memory_order_acquire) > 0; ++i) EMBER_CPU_RELAX();
    if (remaining_.load(std::memory_order_acquire) > 0) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_done_.wait(lock, [&] { return remaining_.load(std::memory_order_acquire) == 0; });
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = nullptr;
    }
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
    return true;
  }

 private:
  void start(int threads) {
    stopping_ = false;
    // Workers start from the current generation: a job posted before a new thread first
    // runs must still count as new to it.
    const uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i, gen] { worker(i, gen); });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_start_.notify_all();
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
      for (int i = 0; i < kSpinIterations && generation_.load(std::memory_order_acquire) == seen; ++i) EMBER_CPU_RELAX();
      if (generation_.load(std::memory_order_acquire) == seen) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_start_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      }
      const std::function<void(int)>* job;
      int nthreads;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) return;
        seen = generation_.load(std::memory_order_acquire);
        job = job_;
        nthreads = job_threads_;
      }
      if (job == nullptr || id >= nthreads) continue;
      execute(*job, id);
      if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mu_);
        cv_done_.notify_one();
      }
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // one parallel region at a time
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> remaining_{0};
  const std::function<void(int)>* job_ = nullptr;
  int job_threads_ = 0;
  bool stopping_ = false;
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
  static ThreadPool* p = new ThreadPool(g_threads.load());
  return *p;
}

}  // namespace

void set_num_threads(int n) {
  EMBER_CHECK(n >= 1, "set_num_threads: expected a positive thread count, got ", n);
  EMBER_CHECK(!tls_in_parallel, "set_num_threads: cannot be called inside a parallel region");
  g_threads = n;
  if (pool().size() != n) pool().resize(n);
}

int get_num_threads() { return g_threads.load(std::memory_order_relaxed); }

bool in_parallel_region() { return tls_in_parallel; }

namespace detail {
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
