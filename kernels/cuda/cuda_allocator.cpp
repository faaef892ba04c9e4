#include "kernels/cuda/cuda_allocator.h"

#include <cstdio>
#include <string>

#include "core/tensor_impl.h"
#include "kernels/cuda/cuda_pool_backend.h"
#include "kernels/cuda/cuda_runtime.h"

namespace ember::cuda {
namespace {

// "1234.5 MiB": fixed notation, so a huge request reads as a number, not 1.07e+09.
std::string mib(int64_t bytes) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / double(1 << 20));
  return buf;
}

// Device memory through the runtime, on the current device: the allocator calls in with the
// pool's device current (allocate runs on it; empty_cache sets it).
class DeviceBackend final : public CudaEventPoolBackend {
 public:
  void* raw_alloc(size_t nbytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, nbytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear the sticky-free error so later calls do not see it
      return nullptr;
    }
    if (err != cudaSuccess) raise_error(err, "cudaMalloc", __FILE__, __LINE__);
    return p;
  }
  // cudaFree waits for the device, so no queued kernel still uses the segment.
  void raw_free(void* ptr) override {
    if (cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
  }
};

}  // namespace

struct CudaCachingAllocator::DevicePool {
  DevicePool() : pool(backend) {}
  DeviceBackend backend;
  BlockPool pool;
};

CudaCachingAllocator::DevicePool& CudaCachingAllocator::pool_for(int device) {
  if (size_t(device) >= pools_.size()) pools_.resize(size_t(device) + 1);
  if (!pools_[size_t(device)]) pools_[size_t(device)] = std::make_unique<DevicePool>();
  return *pools_[size_t(device)];
}

void* CudaCachingAllocator::allocate(size_t nbytes) {
  require_available("CUDA allocator");
  const int dev = current_device();
  const cudaStream_t stream = current_stream();
  std::lock_guard<std::mutex> lock(mu_);
  BlockPool& pool = pool_for(dev).pool;
  void* p = pool.allocate(nbytes, stream);
  if (!p) {
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
    const AllocatorStats st = pool.stats();
    EMBER_FAIL("CUDA out of memory: tried to allocate ", mib(int64_t(nbytes)), " on cuda:", dev, " (",
               mib(int64_t(total_bytes)), " total, ", mib(int64_t(free_bytes)), " free, ", mib(st.bytes_in_use),
               " held by tensors, ", mib(st.bytes_reserved), " reserved by Ember)");
  }
  try {
    owner_.emplace(p, dev);
  } catch (...) {
    pool.free(p);  // out of host memory for the bookkeeping: the block goes back unused
    throw;
  }
  return p;
}

void* CudaCachingAllocator::allocate_on(Device device, size_t nbytes) {
  DeviceGuard guard(device, "CUDA allocator");
  return allocate(nbytes);
}

void CudaCachingAllocator::deallocate(void* ptr, size_t /*nbytes*/) noexcept {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = owner_.find(ptr);
  if (it == owner_.end()) return;  // not ours: nothing we may safely do with it
  const int dev = it->second;
  owner_.erase(it);
  BlockPool& pool = pools_[size_t(dev)]->pool;  // exists: it handed out ptr
  try {
    // A block used on other streams gets an event recorded on each: on the block's device.
    DeviceGuard guard(Device::cuda(dev), "CUDA allocator");
    pool.free(ptr);  // neither allocates nor throws
  } catch (...) {
    // Switching to the block's device fails only when the context is broken; the block is then
    // lost, which is better than throwing from a destructor.
  }
}

void CudaCachingAllocator::record_stream(void* ptr, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = owner_.find(ptr);
  EMBER_CHECK(it != owner_.end(), "record_stream: the pointer was not allocated by Ember's CUDA allocator");
  pool_for(it->second).pool.record_stream(ptr, stream);
}

void CudaCachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t d = 0; d < pools_.size(); ++d) {
    if (!pools_[d]) continue;
    DeviceGuard guard(Device::cuda(int(d)), "empty_cache");
    pools_[d]->pool.release_cached();
  }
}

AllocatorStats CudaCachingAllocator::stats(int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  return size_t(device) < pools_.size() && pools_[size_t(device)] ? pools_[size_t(device)]->pool.stats()
                                                                   : AllocatorStats{};
}

int64_t CudaCachingAllocator::segment_count(int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  return size_t(device) < pools_.size() && pools_[size_t(device)] ? pools_[size_t(device)]->pool.segment_count()
                                                                   : 0;
}

void CudaCachingAllocator::reset_peak(int device) {
  EMBER_CHECK(device >= 0, "reset_peak: invalid CUDA device index ", device);
  std::lock_guard<std::mutex> lock(mu_);
  pool_for(device).pool.reset_peak();
}

CudaCachingAllocator& cuda_allocator() {
  // Leaked on purpose: tensors in static storage may be freed after main returns, and the
  // driver may already be gone then, so cached blocks are never freed at exit.
  static auto* alloc = new CudaCachingAllocator();
  return *alloc;
}

void record_stream(const Tensor& t, cudaStream_t stream) {
  EMBER_CHECK(t.is_cuda(), "record_stream: expected a CUDA tensor, got one on ", t.device());
  void* data = t.impl()->storage->data();
  if (!data) return;  // an empty storage has no memory a later allocation could reuse
  cuda_allocator().record_stream(data, stream);
}

namespace {
// Registration only stores a pointer: no driver call happens at load time.
const bool registered = [] {
  register_allocator(DeviceType::CUDA, &cuda_allocator());
  return true;
}();
}  // namespace

}  // namespace ember::cuda
