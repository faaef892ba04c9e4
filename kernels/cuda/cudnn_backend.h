// cuDNN's graph (backend) API in a few C++ pieces: the calling thread's handle, a descriptor
// that destroys itself, typed attribute setters and getters, and EMBER_CUDNN_CHECK. The backend
// API describes an operation as a graph of descriptors (tensors, the operation, the graph),
// asks cuDNN's heuristics for engine configurations, and builds an execution plan from one;
// kernels/cuda/cudnn_conv_plans.cpp does that for convolutions.
#pragma once
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace ember::cuda {

// The calling thread's cuDNN handle for the current device, bound to the current stream.
cudnnHandle_t cudnn_handle();

[[noreturn]] void raise_cudnn_error(cudnnStatus_t status, const char* call, const char* file, int line);

// cuDNN's element type for a floating dtype; ember::Error for any other dtype.
cudnnDataType_t cudnn_data_type(DType dtype, const char* op);

class BackendDescriptor {
 public:
  explicit BackendDescriptor(cudnnBackendDescriptorType_t type);
  ~BackendDescriptor();
  BackendDescriptor(BackendDescriptor&& other) noexcept : desc_(other.desc_) { other.desc_ = nullptr; }
  BackendDescriptor& operator=(BackendDescriptor&& other) noexcept;
  BackendDescriptor(const BackendDescriptor&) = delete;
  BackendDescriptor& operator=(const BackendDescriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return desc_; }

  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const void* values);
  void set_int64(cudnnBackendAttributeName_t name, int64_t value) { set(name, CUDNN_TYPE_INT64, 1, &value); }
  void set_int64s(cudnnBackendAttributeName_t name, const std::vector<int64_t>& values) {
    set(name, CUDNN_TYPE_INT64, int64_t(values.size()), values.data());
  }
  void set_data_type(cudnnBackendAttributeName_t name, cudnnDataType_t value) {
    set(name, CUDNN_TYPE_DATA_TYPE, 1, &value);
  }
  void set_descriptor(cudnnBackendAttributeName_t name, const BackendDescriptor& value) {
    cudnnBackendDescriptor_t raw = value.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
  }
  void set_handle(cudnnBackendAttributeName_t name, cudnnHandle_t handle) { set(name, CUDNN_TYPE_HANDLE, 1, &handle); }

  // Finalizes, raising ember::Error on failure; try_finalize returns cuDNN's status instead
  // (an engine configuration that does not support a problem is not an error).
  void finalize();
  cudnnStatus_t try_finalize();

  // Up to `capacity` values of an attribute; returns how many there are.
  int64_t get(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t capacity,
              void* values) const;

 private:
  cudnnBackendDescriptor_t desc_ = nullptr;
};

// The heuristics' engine configurations for a finalized operation graph under `mode`, best
// first; none when the heuristics do not finalize for it.
std::vector<BackendDescriptor> engine_configs(const BackendDescriptor& graph, cudnnBackendHeurMode_t mode);

// Scratch memory from the caching allocator for one call, handed back in stream order.
class CudnnScratch {
 public:
  explicit CudnnScratch(int64_t bytes);
  ~CudnnScratch();
  CudnnScratch(const CudnnScratch&) = delete;
  CudnnScratch& operator=(const CudnnScratch&) = delete;
  void* get() const { return ptr_; }

 private:
  size_t bytes_;
  void* ptr_ = nullptr;
};

}  // namespace ember::cuda

// EMBER_CUDNN_CHECK(cudnnBackendExecute(...)) throws ember::Error "cuDNN error: <name>: <cuDNN's
// last message> in <call> at <file>:<line>" when the call does not return CUDNN_STATUS_SUCCESS.
#define EMBER_CUDNN_CHECK(call)                                                      \
  do {                                                                               \
    const cudnnStatus_t ember_cudnn_status_ = (call);                                \
    if (ember_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                 \
      ::ember::cuda::raise_cudnn_error(ember_cudnn_status_, #call, __FILE__, __LINE__); \
  } while (0)
