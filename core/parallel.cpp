#include "core/parallel.h"

#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>

#include "core/error.h"

namespace ember {
namespace {
int default_threads() {
  const int hw = int(std::thread::hardware_concurrency());
  return hw > 0 ? hw : 1;
}
std::atomic<int>& thread_count() {
  static std::atomic<int> n{[] {
    const int n0 = omp_get_max_threads() > 0 ? omp_get_max_threads() : default_threads();
    Eigen::setNbThreads(n0);
    return n0;
  }()};
  return n;
}
}  // namespace

void set_num_threads(int n) {
  EMBER_CHECK(n >= 1, "set_num_threads: expected a positive thread count, got ", n);
  thread_count() = n;
  omp_set_num_threads(n);
  Eigen::setNbThreads(n);
}

int get_num_threads() { return thread_count(); }

bool in_parallel_region() { return omp_in_parallel() != 0; }

namespace detail {
void parallel_for_impl(int64_t begin, int64_t end, int64_t grain,
                       const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t n = end - begin;
  const int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(grain, 1));
  const int nthreads = int(std::min<int64_t>(get_num_threads(), max_chunks));
  std::exception_ptr error;
  std::atomic<bool> failed{false};
#pragma omp parallel num_threads(nthreads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t chunk = (n + nt - 1) / nt;
    const int64_t b = begin + t * chunk, e = std::min(end, b + chunk);
    if (b < e) {
      try {
        fn(b, e);
      } catch (...) {
        // Exceptions must not escape an OpenMP region: keep the first, rethrow outside.
        if (!failed.exchange(true)) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}
}  // namespace detail

}  // namespace ember
