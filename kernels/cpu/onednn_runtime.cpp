#include "kernels/cpu/onednn_runtime.h"

#include <omp.h>

#include <cstdlib>
#include <optional>

#include "core/error.h"

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
  struct Buffer {
    void* data = nullptr;
    size_t size = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer buffer;
  if (buffer.size < bytes) {
    std::free(buffer.data);
    buffer.size = (bytes + 63) / 64 * 64;
    buffer.data = std::aligned_alloc(64, buffer.size);
    EMBER_CHECK(buffer.data != nullptr, "oneDNN: cannot allocate ", buffer.size, " bytes of primitive scratch memory");
  }
  return buffer.data;
}

OmpThreads::OmpThreads(int threads) : previous_(omp_get_max_threads()), threads_(threads) {
  if (previous_ != threads_) omp_set_num_threads(threads_);
}

OmpThreads::~OmpThreads() {
  if (previous_ != threads_) omp_set_num_threads(previous_);
}

}  // namespace ember::cpu
