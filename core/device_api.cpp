#include "core/device_api.h"

#include "core/error.h"

namespace ember {
namespace {

detail::CudaHooks& hooks() {
  static detail::CudaHooks h;
  return h;
}

const detail::CudaHooks& require_cuda(const char* what) {
  const detail::CudaHooks& h = hooks();
  EMBER_CHECK(h.device_count != nullptr, what,
              ": Ember was built without CUDA support (rebuild with the CUDA toolkit installed)");
  EMBER_CHECK(h.device_count() > 0, what, ": no CUDA device is available on this machine");
  return h;
}

// -1 selects the current device; anything else must name a visible device.
int resolve(const detail::CudaHooks& h, int index, const char* what) {
  if (index == -1) return h.current_device();
  EMBER_CHECK(index >= 0 && index < h.device_count(), what, ": invalid CUDA device index ", index,
              " (", h.device_count(), " CUDA device(s) visible)");
  return index;
}

}  // namespace

namespace detail {
void register_cuda_hooks(const CudaHooks& h) { hooks() = h; }
}  // namespace detail

int cuda_device_count() {
  const detail::CudaHooks& h = hooks();
  return h.device_count ? h.device_count() : 0;
}

bool cuda_is_available() { return cuda_device_count() > 0; }

int cuda_current_device() { return require_cuda("cuda_current_device").current_device(); }

void cuda_set_device(int index) {
  const auto& h = require_cuda("cuda_set_device");
  h.set_device(resolve(h, index, "cuda_set_device"));
}

void cuda_synchronize(int index) {
  const auto& h = require_cuda("cuda_synchronize");
  h.synchronize(resolve(h, index, "cuda_synchronize"));
}

AllocatorStats cuda_memory_stats(int index) {
  const auto& h = require_cuda("cuda_memory_stats");
  return h.memory_stats(resolve(h, index, "cuda_memory_stats"));
}

void cuda_reset_peak_memory_stats(int index) {
  const auto& h = require_cuda("cuda_reset_peak_memory_stats");
  h.reset_peak_memory_stats(resolve(h, index, "cuda_reset_peak_memory_stats"));
}

void cuda_empty_cache() {
  if (hooks().empty_cache && cuda_is_available()) hooks().empty_cache();
}

}  // namespace ember
