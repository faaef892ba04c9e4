// Connects core/device_api.h to the CUDA runtime and the caching allocator.
#include "core/device_api.h"
#include "kernels/cuda/cuda_allocator.h"
#include "kernels/cuda/cuda_runtime.h"

namespace ember::cuda {
namespace {

const bool registered = [] {
  detail::CudaHooks h;
  h.device_count = &device_count;
  h.current_device = &current_device;
  h.set_device = &set_device;
  h.synchronize = &synchronize;
  h.memory_stats = [](int index) { return cuda_allocator().stats(index); };
  h.reset_peak_memory_stats = [](int index) { cuda_allocator().reset_peak(index); };
  h.empty_cache = [] { cuda_allocator().empty_cache(); };
  detail::register_cuda_hooks(h);
  return true;
}();

}  // namespace
}  // namespace ember::cuda
