#include "kernels/cuda/cuda_pool_backend.h"

#include "kernels/cuda/cuda_runtime.h"

namespace ember::cuda {

void* CudaEventPoolBackend::record_event(void* stream) {
  cudaEvent_t e = nullptr;
  EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  EMBER_CUDA_CHECK(cudaEventRecord(e, static_cast<cudaStream_t>(stream)));
  return e;
}

bool CudaEventPoolBackend::event_done(void* event) {
  const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

void CudaEventPoolBackend::destroy_event(void* event) { (void)cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

}  // namespace ember::cuda
