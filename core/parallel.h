// Intra-op threading. One pool (OpenMP) serves Ember's kernels and the GEMM library, so the
// two never fight over the cores. Nested calls run serially on the calling thread.
#pragma once
#include <cstdint>
#include <functional>

namespace ember {

void set_num_threads(int n);  // also sets the GEMM library's thread count
int get_num_threads();
bool in_parallel_region();

namespace detail {
void parallel_for_impl(int64_t begin, int64_t end, int64_t grain,
                       const std::function<void(int64_t, int64_t)>& fn);
}

// Splits [begin, end) into at most get_num_threads() contiguous chunks of at least `grain`
// items and calls fn(chunk_begin, chunk_end) on each, in parallel. Small ranges run inline.
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
