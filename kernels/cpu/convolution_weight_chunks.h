// How every CPU path splits a convolution's weight gradient over Ember's threads: the batch in
// one chunk of images per thread, each chunk summing its images into its own zeroed partial
// dW, the partials then added in chunk order, so the result does not depend on which thread
// ran which chunk. A single chunk writes straight into dW.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/parallel.h"
#include "kernels/cpu/scratch.h"

namespace ember::cpu {

// run_chunk(first_image, end_image, acc) adds images [first, end)'s gradient into acc (`size`
// values, zero on entry). The partials live in the calling thread's scratch slot `slot`, which
// run_chunk must not use.
template <typename T, typename RunChunk>
void sum_weight_gradient_over_chunks(int64_t batch, T* dw, int64_t size, int slot, const RunChunk& run_chunk) {
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(batch, get_num_threads()));
  T* partials = chunks == 1 ? dw : thread_scratch<T>(slot, size_t(chunks * size));
  std::fill(partials, partials + chunks * size, T(0));
  auto run = [&](int64_t c) { run_chunk(batch * c / chunks, batch * (c + 1) / chunks, partials + c * size); };
  if (chunks == 1) return run(0);
  parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) run(c);
  });
  for (int64_t i = 0; i < size; ++i) {
    T s = partials[i];
    for (int64_t c = 1; c < chunks; ++c) s += partials[c * size + i];
    dw[i] = s;
  }
}

}  // namespace ember::cpu
