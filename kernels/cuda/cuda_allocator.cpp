#include "kernels/cuda/cuda_allocator.h"

#include <algorithm>

#include "kernels/cuda/cuda_runtime.h"

namespace ember::cuda {
namespace {
double mib(size_t bytes) { return double(bytes) / double(1 << 20); }
double mib(int64_t bytes) { return double(bytes) / double(1 << 20); }
}  // namespace

size_t CudaCachingAllocator::round_size(size_t n) {
  if (n <= kMinBlock) return kMinBlock;
  if (n <= (size_t(1) << 20)) {
    size_t p = kMinBlock;
    while (p < n) p <<= 1;
    return p;
  }
  size_t p = size_t(1) << 20;
  while (p * 2 <= n) p <<= 1;  // p <= n < 2p
  const size_t step = p / 8;
  return (n + step - 1) / step * step;
}

AllocatorStats& CudaCachingAllocator::stats_for(int device) {
  if (size_t(device) >= stats_.size()) stats_.resize(size_t(device) + 1);
  return stats_[size_t(device)];
}

void* CudaCachingAllocator::allocate(size_t nbytes) {
  require_available("CUDA allocator");
  const int dev = current_device();
  const cudaStream_t stream = current_stream();
  const size_t size = round_size(nbytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    AllocatorStats& st = stats_for(dev);
    ++st.num_allocations;
    auto it = pools_.find(PoolKey{dev, stream, size});
    if (it != pools_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      live_[p] = Block{size, dev, stream};
      ++st.num_cache_hits;
      st.bytes_in_use += int64_t(size);
      st.peak_bytes_in_use = std::max(st.peak_bytes_in_use, st.bytes_in_use);
      return p;
    }
  }
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, size);
  if (err == cudaErrorMemoryAllocation) {
    // Cached blocks of other size classes may be enough: give them back and try once more.
    (void)cudaGetLastError();
    {
      std::lock_guard<std::mutex> lock(mu_);
      release_cached(dev);
    }
    err = cudaMalloc(&p, size);
  }
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
    const AllocatorStats st = stats(dev);
    EMBER_FAIL("CUDA out of memory: tried to allocate ", mib(nbytes), " MiB on cuda:", dev, " (",
               mib(total_bytes), " MiB total, ", mib(free_bytes), " MiB free, ", mib(st.bytes_in_use),
               " MiB held by tensors, ", mib(st.bytes_reserved), " MiB reserved by Ember)");
  }
  if (err != cudaSuccess) raise_error(err, "cudaMalloc", __FILE__, __LINE__);
  std::lock_guard<std::mutex> lock(mu_);
  AllocatorStats& st = stats_for(dev);
  live_[p] = Block{size, dev, stream};
  st.bytes_reserved += int64_t(size);
  st.bytes_in_use += int64_t(size);
  st.peak_bytes_in_use = std::max(st.peak_bytes_in_use, st.bytes_in_use);
  return p;
}

void CudaCachingAllocator::deallocate(void* ptr, size_t /*nbytes*/) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return;  // not ours: nothing we may safely do with it
  const Block b = it->second;
  live_.erase(it);
  pools_[PoolKey{b.device, b.stream, b.size}].push_back(ptr);
  stats_for(b.device).bytes_in_use -= int64_t(b.size);
}

void CudaCachingAllocator::release_cached(int device) {
  for (auto& [key, blocks] : pools_) {
    if (std::get<0>(key) != device) continue;
    // cudaFree waits for the device, so no queued kernel still uses the block.
    for (void* p : blocks) {
      if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
    }
    stats_for(device).bytes_reserved -= int64_t(std::get<2>(key) * blocks.size());
    blocks.clear();
  }
}

void CudaCachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (int d = 0; d < int(stats_.size()); ++d) release_cached(d);
}

AllocatorStats CudaCachingAllocator::stats(int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  return size_t(device) < stats_.size() ? stats_[size_t(device)] : AllocatorStats{};
}

void CudaCachingAllocator::reset_peak(int device) {
  EMBER_CHECK(device >= 0, "reset_peak: invalid CUDA device index ", device);
  std::lock_guard<std::mutex> lock(mu_);
  AllocatorStats& st = stats_for(device);
  st.peak_bytes_in_use = st.bytes_in_use;
}

CudaCachingAllocator& cuda_allocator() {
  // Leaked on purpose: tensors in static storage may be freed after main returns, and the
  // driver may already be gone then, so cached blocks are never freed at exit.
  static auto* alloc = new CudaCachingAllocator();
  return *alloc;
}

namespace {
// Registration only stores a pointer: no driver call happens at load time.
const bool registered = [] {
  register_allocator(DeviceType::CUDA, &cuda_allocator());
  return true;
}();
}  // namespace

}  // namespace ember::cuda
