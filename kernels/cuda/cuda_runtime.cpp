#include "kernels/cuda/cuda_runtime.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace ember::cuda {
namespace {

struct Discovery {
  int count = 0;
  std::string why_none;  // the runtime's explanation when count is 0
};

const Discovery& discovery() {
  static const Discovery d = [] {
    Discovery r;
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // "no device" is not sticky: clear it for later calls
      const std::string detail = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
      if (err == cudaErrorInsufficientDriver)  // also what the runtime says when no driver exists
        r.why_none = "no usable NVIDIA driver was found (" + detail + ")";
      else if (err == cudaErrorNoDevice)
        r.why_none = "no CUDA-capable GPU was found (" + detail + ")";
      else
        r.why_none = detail;
      n = 0;
    } else if (n == 0) {
      r.why_none = "the runtime reports no devices";
    }
    r.count = n;
    return r;
  }();
  return d;
}

thread_local cudaStream_t tls_stream = nullptr;

const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

}  // namespace

int device_count() { return discovery().count; }
bool is_available() { return device_count() > 0; }

void require_available(const char* what) {
  const Discovery& d = discovery();
  EMBER_CHECK(d.count > 0, what, ": no CUDA device is available: ", d.why_none,
              ". Ember was built with CUDA, but CUDA tensors need a GPU and its driver; use Device::cpu() "
              "on this machine");
}

void check_device(Device d, const char* what) {
  EMBER_CHECK(d.is_cuda(), what, ": expected a CUDA device, got ", d);
  require_available(what);
  EMBER_CHECK(d.index >= 0 && d.index < device_count(), what, ": invalid CUDA device index ", d.index,
              " (", device_count(), " CUDA device(s) visible)");
}

int current_device() {
  require_available("current_device");
  int dev = 0;
  EMBER_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

void set_device(int index) {
  check_device(Device::cuda(index), "set_device");
  EMBER_CUDA_CHECK(cudaSetDevice(index));
}

void synchronize(int index) {
  DeviceGuard guard(Device::cuda(index), "synchronize");
  EMBER_CUDA_CHECK(cudaDeviceSynchronize());
}

int multiprocessor_count(int index) {
  static std::mutex mu;
  static std::vector<int> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (cache.empty()) cache.assign(size_t(device_count()), 0);
  EMBER_CHECK(index >= 0 && index < int(cache.size()), "multiprocessor_count: invalid CUDA device index ",
              index);
  if (cache[size_t(index)] == 0) {
    int n = 0;
    EMBER_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, index));
    cache[size_t(index)] = n;
  }
  return cache[size_t(index)];
}

cudaStream_t current_stream() { return tls_stream; }
void set_current_stream(cudaStream_t stream) { tls_stream = stream; }

void raise_error(cudaError_t err, const char* call, const char* file, int line) {
  // Clears the error when it is not sticky, so the caller may recover (e.g. after out of memory).
  (void)cudaGetLastError();
  EMBER_FAIL("CUDA error: ", cudaGetErrorString(err), " (", cudaGetErrorName(err), ") in ", call,
             " at ", base_name(file), ":", line);
}

DeviceGuard::DeviceGuard(Device d, const char* what) {
  check_device(d, what);
  int cur = 0;
  EMBER_CUDA_CHECK(cudaGetDevice(&cur));
  if (cur != d.index) {
    EMBER_CUDA_CHECK(cudaSetDevice(d.index));
    previous_ = cur;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);  // a destructor must not throw
}

bool EnvSwitch::get() {
  int state = state_.load();
  if (state < 0) {
    const char* value = std::getenv(env_);
    int from_env = default_on_ ? 1 : 0;
    if (value != nullptr && std::strcmp(value, "1") == 0) from_env = 1;
    if (value != nullptr && std::strcmp(value, "0") == 0) from_env = 0;
    state_.compare_exchange_strong(state, from_env);  // a concurrent set() wins
    state = state_.load();
  }
  return state == 1;
}

}  // namespace ember::cuda
