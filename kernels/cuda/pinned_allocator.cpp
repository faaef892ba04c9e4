#include "kernels/cuda/pinned_allocator.h"

#include "kernels/cuda/cuda_pool_backend.h"
#include "kernels/cuda/cuda_runtime.h"

namespace ember::cuda {
namespace {
// The pool key of every pinned block. It is no stream, so a copy on any stream, the legacy
// default stream (null) included, counts as another stream's use and delays reuse.
char host_key;
}  // namespace

class PinnedHostAllocator::Backend final : public CudaEventPoolBackend {
 public:
  void* raw_alloc(size_t nbytes) override {
    void* p = nullptr;
    // Portable: the block may feed copies to any device of the process.
    const cudaError_t err = cudaHostAlloc(&p, nbytes, cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    if (err != cudaSuccess) raise_error(err, "cudaHostAlloc", __FILE__, __LINE__);
    return p;
  }
  void raw_free(void* ptr) override {
    if (cudaFreeHost(ptr) != cudaSuccess) (void)cudaGetLastError();
  }
};

PinnedHostAllocator::PinnedHostAllocator()
    : backend_(std::make_unique<Backend>()), pool_(std::make_unique<BlockPool>(*backend_)) {}

void* PinnedHostAllocator::allocate(size_t nbytes) {
  require_available("pin_memory");
  std::lock_guard<std::mutex> lock(mu_);
  void* p = pool_->allocate(nbytes, &host_key);
  EMBER_CHECK(p != nullptr, "pin_memory: could not pin ", nbytes, " bytes of host memory (",
              pool_->stats().bytes_reserved, " bytes already pinned by Ember)");
  return p;
}

void PinnedHostAllocator::deallocate(void* ptr, size_t /*nbytes*/) noexcept {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  pool_->free(ptr);  // neither allocates nor throws
}

void PinnedHostAllocator::record_use(void* ptr, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  pool_->record_stream(ptr, stream);
}

AllocatorStats PinnedHostAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pool_->stats();
}

void PinnedHostAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  pool_->release_cached();
}

PinnedHostAllocator& pinned_host_allocator() {
  static auto* alloc = new PinnedHostAllocator();  // leaked: see cuda_allocator()
  return *alloc;
}

namespace {
const bool registered = [] {
  register_pinned_allocator(&pinned_host_allocator());
  return true;
}();
}  // namespace

}  // namespace ember::cuda
