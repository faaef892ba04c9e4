#include "kernels/cuda/cublas_handles.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_allocator.h"
#include "kernels/cuda/cuda_runtime.h"

namespace ember::cuda {
namespace {

// Handles released by exited threads, per device, waiting for the next thread. Never
// destroyed: the pool outlives every thread_local holder, and destroying a handle at process
// exit could run after the driver has shut down.
struct HandlePool {
  std::mutex mu;
  std::vector<std::vector<cublasLtHandle_t>> lt;
  std::vector<std::vector<cublasHandle_t>> blas;
};

HandlePool& pool() {
  static HandlePool* p = new HandlePool;
  return *p;
}

template <typename H>
void grow(std::vector<H>& v, size_t n) {
  if (v.size() < n) v.resize(n, nullptr);
}

// The calling thread's handles, indexed by device; returned to the pool when the thread ends.
struct ThreadHandles {
  std::vector<cublasLtHandle_t> lt;
  std::vector<cublasHandle_t> blas;

  ~ThreadHandles() {
    HandlePool& p = pool();
    std::lock_guard<std::mutex> lock(p.mu);
    for (size_t d = 0; d < lt.size(); ++d)
      if (lt[d]) {
        if (p.lt.size() <= d) p.lt.resize(d + 1);
        p.lt[d].push_back(lt[d]);
      }
    for (size_t d = 0; d < blas.size(); ++d)
      if (blas[d]) {
        if (p.blas.size() <= d) p.blas.resize(d + 1);
        p.blas[d].push_back(blas[d]);
      }
  }
};

thread_local ThreadHandles tls_handles;

// A pooled handle for `device`, or nullptr when the pool has none.
template <typename H>
H take_pooled(std::vector<std::vector<H>>& pooled, int device) {
  std::lock_guard<std::mutex> lock(pool().mu);
  if (size_t(device) >= pooled.size() || pooled[size_t(device)].empty()) return nullptr;
  H h = pooled[size_t(device)].back();
  pooled[size_t(device)].pop_back();
  return h;
}

std::atomic<int> tf32_state{-1};  // -1: not yet read from the environment

}  // namespace

cublasLtHandle_t lt_handle() {
  const int device = current_device();
  grow(tls_handles.lt, size_t(device) + 1);
  cublasLtHandle_t& h = tls_handles.lt[size_t(device)];
  if (!h) {
    h = take_pooled(pool().lt, device);
    if (!h) EMBER_CUBLAS_CHECK(cublasLtCreate(&h));
  }
  return h;
}

cublasHandle_t blas_handle() {
  const int device = current_device();
  grow(tls_handles.blas, size_t(device) + 1);
  cublasHandle_t& h = tls_handles.blas[size_t(device)];
  if (!h) {
    h = take_pooled(pool().blas, device);
    if (!h) EMBER_CUBLAS_CHECK(cublasCreate(&h));
  }
  return h;
}

void* lt_workspace() {
  static std::mutex mu;
  static auto* workspaces = new std::map<std::pair<int, cudaStream_t>, void*>;
  const std::pair<int, cudaStream_t> key{current_device(), current_stream()};
  std::lock_guard<std::mutex> lock(mu);
  auto it = workspaces->find(key);
  if (it != workspaces->end()) return it->second;
  // Allocated on the current device and tagged with the current stream: exactly the key.
  void* p = cuda_allocator().allocate(kLtWorkspaceBytes);
  workspaces->emplace(key, p);
  return p;
}

void set_allow_tf32(bool on) { tf32_state.store(on ? 1 : 0); }

bool allow_tf32() {
  int state = tf32_state.load();
  if (state < 0) {
    const char* env = std::getenv("EMBER_ALLOW_TF32");
    const int from_env = (env != nullptr && std::strcmp(env, "1") == 0) ? 1 : 0;
    // A concurrent set_allow_tf32 wins over the environment.
    tf32_state.compare_exchange_strong(state, from_env);
    state = tf32_state.load();
  }
  return state == 1;
}

void raise_blas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  const char* slash = std::strrchr(file, '/');
  EMBER_FAIL("cuBLAS error: ", cublasLtGetStatusString(status), " (", cublasLtGetStatusName(status), ") in ", call,
             " at ", slash ? slash + 1 : file, ":", line);
}

}  // namespace ember::cuda
