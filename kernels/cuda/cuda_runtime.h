// Thin, exception-safe access to the CUDA runtime: device discovery, the current device and
// stream, and EMBER_CUDA_CHECK, which turns a failed runtime call into an ember::Error.
// Nothing here touches the driver until first asked, so a build with CUDA loads and runs
// on machines without a GPU; every query answers "no device" and every use raises.
#pragma once
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "core/device.h"
#include "core/error.h"

namespace ember::cuda {

// Visible devices; 0 when there is no GPU or no driver. Never throws. Queried once.
int device_count();
bool is_available();
// Throws ember::Error naming `what` when no device is usable (says why: no GPU, no driver).
void require_available(const char* what);
// Throws unless `d` is a CUDA device whose index exists on this machine.
void check_device(Device d, const char* what);

int current_device();
void set_device(int index);
void synchronize(int index);
int multiprocessor_count(int index);  // cached per device

// The stream kernels of this thread are queued on; null (the legacy default stream) unless
// set. The caching allocator hands a freed block out again only on the stream it was
// allocated on; work that uses it on another stream must finish before it is freed.
cudaStream_t current_stream();
void set_current_stream(cudaStream_t stream);

[[noreturn]] void raise_error(cudaError_t err, const char* call, const char* file, int line);

// A process-wide on/off switch (TF32 products, cuDNN benchmarking, cuDNN batch norm): the
// environment variable `env` read once turns it on ("1") or off ("0"); unset or any other value
// leaves it at `default_on`. set() overrides the environment from then on.
class EnvSwitch {
 public:
  explicit constexpr EnvSwitch(const char* env, bool default_on = false) : env_(env), default_on_(default_on) {}
  bool get();
  void set(bool on) { state_.store(on ? 1 : 0); }

 private:
  const char* env_;
  bool default_on_;
  std::atomic<int> state_{-1};  // -1: not yet read from the environment
};

// Makes `d` the current device for a scope and restores the previous one after it. Throws,
// naming `what`, when `d` is not a usable CUDA device.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device d, const char* what = "CUDA");
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  // -1: nothing to restore
};

}  // namespace ember::cuda

// EMBER_CUDA_CHECK(cudaMalloc(&p, n)) throws ember::Error "CUDA error: <message> (<name>) in
// <call> at <file>:<line>" when the call fails.
#define EMBER_CUDA_CHECK(call)                                                 \
  do {                                                                         \
    const cudaError_t ember_cuda_err_ = (call);                                \
    if (ember_cuda_err_ != cudaSuccess)                                        \
      ::ember::cuda::raise_error(ember_cuda_err_, #call, __FILE__, __LINE__);  \
  } while (0)
