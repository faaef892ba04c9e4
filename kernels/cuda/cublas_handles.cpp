#include "kernels/cuda/cublas_handles.h"

#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/cuda/cuda_allocator.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/thread_handles.h"

namespace ember::cuda {
namespace {

HandleShelf<cublasLtHandle_t>& lt_shelf() {
  static auto* shelf = new HandleShelf<cublasLtHandle_t>;
  return *shelf;
}
HandleShelf<cublasHandle_t>& blas_shelf() {
  static auto* shelf = new HandleShelf<cublasHandle_t>;
  return *shelf;
}
thread_local ThreadHandles<cublasLtHandle_t> tls_lt{&lt_shelf()};
thread_local ThreadHandles<cublasHandle_t> tls_blas{&blas_shelf()};

EnvSwitch tf32_switch{"EMBER_ALLOW_TF32"};

}  // namespace

cublasLtHandle_t lt_handle() {
  return tls_lt.get(current_device(), [] {
    cublasLtHandle_t h = nullptr;
    EMBER_CUBLAS_CHECK(cublasLtCreate(&h));
    return h;
  });
}

cublasHandle_t blas_handle() {
  return tls_blas.get(current_device(), [] {
    cublasHandle_t h = nullptr;
    EMBER_CUBLAS_CHECK(cublasCreate(&h));
    return h;
  });
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

void set_allow_tf32(bool on) { tf32_switch.set(on); }

bool allow_tf32() { return tf32_switch.get(); }

void raise_blas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  const char* slash = std::strrchr(file, '/');
  EMBER_FAIL("cuBLAS error: ", cublasLtGetStatusString(status), " (", cublasLtGetStatusName(status), ") in ", call,
             " at ", slash ? slash + 1 : file, ":", line);
}

}  // namespace ember::cuda
