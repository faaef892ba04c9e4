#include "kernels/cpu/onednn_runtime.h"

#include <omp.h>

#include <cstdlib>
#include <optional>

#include "core/error.h"
#include "kernels/cpu/aligned_buffer.h"

namespace ember::cpu {

const dnnl::engine& onednn_engine() {
  static const dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

dnnl::stream& onednn_thread_stream() {
  thread_local std::optional<dnnl::stream> stream;
  if (!stream) stream.emplace(onednn_engine());
  return *stream;
}

void* onednn_thread_scratchpad(size_t bytes) {
  thread_local AlignedBuffer buffer;
  return buffer.get(bytes, "oneDNN primitive scratchpad");
}

OmpThreads::OmpThreads(int threads) : previous_(omp_get_max_threads()), threads_(threads) {
  if (previous_ != threads_) omp_set_num_threads(threads_);
}

OmpThreads::~OmpThreads() {
  if (previous_ != threads_) omp_set_num_threads(previous_);
}

}  // namespace ember::cpu
