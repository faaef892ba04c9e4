#include "kernels/cuda/cuda_stream.h"

#include "kernels/cuda/cuda_runtime.h"

namespace ember::cuda {

Stream::Stream(Device device, int priority) : device_(device) {
  DeviceGuard guard(device, "Stream");
  int least = 0, greatest = 0;
  EMBER_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  EMBER_CHECK(priority <= least && priority >= greatest, "Stream: priority ", priority, " is outside ", greatest,
              " (highest) .. ", least, " (lowest) on ", device);
  cudaStream_t s = nullptr;
  EMBER_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority));
  handle_ = std::shared_ptr<cudaStream_t>(new cudaStream_t(s), [](cudaStream_t* p) {
    (void)cudaStreamDestroy(*p);  // queued work still completes; the handle goes
    delete p;
  });
}

Stream Stream::wrap(cudaStream_t handle, Device device) {
  check_device(device, "Stream::wrap");
  Stream s;
  s.device_ = device;
  if (handle) s.handle_ = std::shared_ptr<cudaStream_t>(new cudaStream_t(handle));
  return s;
}

Event Stream::record() const {
  Event e;
  e.record(*this);
  return e;
}

void Stream::wait(const Event& e) const {
  DeviceGuard guard(device_, "Stream::wait");
  EMBER_CUDA_CHECK(cudaStreamWaitEvent(handle(), e.handle(), 0));
}

void Stream::synchronize() const {
  DeviceGuard guard(device_, "Stream::synchronize");
  EMBER_CUDA_CHECK(cudaStreamSynchronize(handle()));
}

bool Stream::query() const {
  DeviceGuard guard(device_, "Stream::query");
  const cudaError_t err = cudaStreamQuery(handle());
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  EMBER_CUDA_CHECK(err);
  return true;
}

Stream current() { return Stream::wrap(current_stream(), Device::cuda(current_device())); }

Event::Event(bool timing) {
  require_available("Event");
  cudaEvent_t e = nullptr;
  EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  handle_ = std::shared_ptr<cudaEvent_t>(new cudaEvent_t(e), [](cudaEvent_t* p) {
    (void)cudaEventDestroy(*p);
    delete p;
  });
}

void Event::record(const Stream& s) {
  DeviceGuard guard(s.device(), "Event::record");
  EMBER_CUDA_CHECK(cudaEventRecord(handle(), s.handle()));
}

void Event::synchronize() const { EMBER_CUDA_CHECK(cudaEventSynchronize(handle())); }

bool Event::query() const {
  const cudaError_t err = cudaEventQuery(handle());
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  EMBER_CUDA_CHECK(err);
  return true;
}

float Event::elapsed_ms(const Event& end) const {
  float ms = 0;
  EMBER_CUDA_CHECK(cudaEventElapsedTime(&ms, handle(), end.handle()));
  return ms;
}

StreamGuard::StreamGuard(const Stream& s) : previous_stream_(current_stream()), previous_device_(current_device()) {
  set_device(s.device().index);
  set_current_stream(s.handle());
}

StreamGuard::~StreamGuard() {
  set_current_stream(previous_stream_);
  (void)cudaSetDevice(previous_device_);
}

}  // namespace ember::cuda
