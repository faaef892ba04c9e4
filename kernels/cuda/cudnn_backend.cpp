#include "kernels/cuda/cudnn_backend.h"

#include <algorithm>
#include <cstring>

#include "kernels/cuda/cuda_allocator.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/thread_handles.h"

namespace ember::cuda {
namespace {

HandleShelf<cudnnHandle_t>& cudnn_shelf() {
  static auto* shelf = new HandleShelf<cudnnHandle_t>;
  return *shelf;
}
thread_local ThreadHandles<cudnnHandle_t> tls_cudnn{&cudnn_shelf()};

}  // namespace

cudnnHandle_t cudnn_handle() {
  cudnnHandle_t h = tls_cudnn.get(current_device(), [] {
    cudnnHandle_t created = nullptr;
    EMBER_CUDNN_CHECK(cudnnCreate(&created));
    return created;
  });
  EMBER_CUDNN_CHECK(cudnnSetStream(h, current_stream()));
  return h;
}

void raise_cudnn_error(cudnnStatus_t status, const char* call, const char* file, int line) {
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  const char* slash = std::strrchr(file, '/');
  EMBER_FAIL("cuDNN error: ", cudnnGetErrorString(status), detail[0] ? ": " : "", detail, " in ", call, " at ",
             slash ? slash + 1 : file, ":", line);
}

cudnnDataType_t cudnn_data_type(DType dtype, const char* op) {
  switch (dtype) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f64: return CUDNN_DATA_DOUBLE;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    default: EMBER_FAIL(op, ": cuDNN has no kernel for dtype ", dtype);
  }
}

BackendDescriptor::BackendDescriptor(cudnnBackendDescriptorType_t type) {
  EMBER_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &desc_));
}

BackendDescriptor::~BackendDescriptor() {
  if (desc_) cudnnBackendDestroyDescriptor(desc_);
}

BackendDescriptor& BackendDescriptor::operator=(BackendDescriptor&& other) noexcept {
  if (this != &other) {
    if (desc_) cudnnBackendDestroyDescriptor(desc_);
    desc_ = other.desc_;
    other.desc_ = nullptr;
  }
  return *this;
}

void BackendDescriptor::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                            const void* values) {
  EMBER_CUDNN_CHECK(cudnnBackendSetAttribute(desc_, name, type, count, values));
}

void BackendDescriptor::finalize() { EMBER_CUDNN_CHECK(cudnnBackendFinalize(desc_)); }

cudnnStatus_t BackendDescriptor::try_finalize() { return cudnnBackendFinalize(desc_); }

int64_t BackendDescriptor::get(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t capacity,
                               void* values) const {
  int64_t count = 0;
  EMBER_CUDNN_CHECK(cudnnBackendGetAttribute(desc_, name, type, capacity, &count, values));
  return count;
}

std::vector<BackendDescriptor> engine_configs(const BackendDescriptor& graph, cudnnBackendHeurMode_t mode) {
  BackendDescriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heuristics.set_descriptor(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  heuristics.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (heuristics.try_finalize() != CUDNN_STATUS_SUCCESS) return {};
  const int64_t count = heuristics.get(CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, nullptr);
  std::vector<BackendDescriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  if (count == 0) return configs;
  const int64_t got = heuristics.get(CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, raw.data());
  configs.erase(configs.begin() + std::min(got, count), configs.end());
  return configs;
}

CudnnScratch::CudnnScratch(int64_t bytes) : bytes_(size_t(std::max<int64_t>(bytes, 0))) {
  if (bytes_ > 0) ptr_ = cuda_allocator().allocate(bytes_);
}

CudnnScratch::~CudnnScratch() {
  if (ptr_) cuda_allocator().deallocate(ptr_, bytes_);
}

}  // namespace ember::cuda
