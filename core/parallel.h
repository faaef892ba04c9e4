// Intra-op threading on Ember's own pool. Workers poll for about a millisecond between jobs
// (the serial gaps between ops in a training step are mostly shorter, and waking a sleeping
// thread costs tens to hundreds of microseconds in a virtual machine) and then sleep, so they
// never burn a core for long that another process or a data-loader thread needs; a pool with
// more threads than usable CPUs polls only ~20 us. EMBER_SPIN_US sets the polling time (0:
// sleep at once).
// One parallel region runs at a time; a nested call, or a call from a second thread while the
// pool is busy, runs serially on the calling thread.
#pragma once
#include <cstdint>
#include <functional>

namespace ember {

void set_num_threads(int n);
int get_num_threads();
bool in_parallel_region();

namespace detail {
void parallel_for_impl(int64_t begin, int64_t end, int64_t grain,
                       const std::function<void(int64_t, int64_t)>& fn);
}

// Splits [begin, end) into at most get_num_threads() contiguous chunks of at least `grain`
// items and calls fn(chunk_begin, chunk_end) on each, in parallel. Small ranges run inline.
// The first exception thrown by any chunk is rethrown on the calling thread.
template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& fn) {
  if (end <= begin) return;
  if (end - begin <= grain || get_num_threads() == 1 || in_parallel_region()) {
    fn(begin, end);
    return;
  }
  detail::parallel_for_impl(begin, end, grain, fn);
}

}  // namespace ember
