// Streams and events for user code, as torch.cuda.Stream / Event / stream(): work queued on
// different streams may overlap; events order one stream after another and time GPU work.
//
//   cuda::Stream side(Device::cuda(0));
//   { cuda::StreamGuard on(side); y = f(x); }       // f's kernels queue on `side`
//   cuda::current().wait(side.record());             // later work on the main stream sees y
//   cuda::record_stream(x, side.handle());           // x was used on `side` too
#pragma once
#include <cuda_runtime_api.h>

#include <memory>

#include "core/device.h"

namespace ember::cuda {

class Event;

class Stream {
 public:
  // A new non-blocking stream on `device` (lower priority numbers run first when both wait).
  explicit Stream(Device device, int priority = 0);
  // Wraps an existing stream (not owned), e.g. the legacy default stream (nullptr).
  static Stream wrap(cudaStream_t handle, Device device);

  cudaStream_t handle() const { return handle_.get() ? *handle_ : nullptr; }
  Device device() const { return device_; }
  // Queues an event after everything queued so far and returns it.
  Event record() const;
  // Later work on this stream waits for `e` (the host does not).
  void wait(const Event& e) const;
  void synchronize() const;
  bool query() const;  // true when all queued work has finished

 private:
  Stream() = default;
  std::shared_ptr<cudaStream_t> handle_;  // null inside: the legacy default stream
  Device device_ = Device::cuda(0);
};

// The stream this thread's kernels queue on.
Stream current();

class Event {
 public:
  // timing: elapsed_ms works on it (a little slower to record).
  explicit Event(bool timing = false);
  void record(const Stream& s);
  void synchronize() const;
  bool query() const;
  // Milliseconds between this event and a later one; both recorded with timing and finished.
  float elapsed_ms(const Event& end) const;
  cudaEvent_t handle() const { return *handle_; }

 private:
  std::shared_ptr<cudaEvent_t> handle_;
};

// Makes `s` this thread's current stream (and its device the current device) for a scope.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  cudaStream_t previous_stream_;
  int previous_device_;
};

}  // namespace ember::cuda
