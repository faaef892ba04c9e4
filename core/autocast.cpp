#include "core/autocast.h"

#include "core/error.h"

namespace ember {
namespace {
struct DeviceAutocast {
  bool enabled = false;
  DType dtype;
};
thread_local DeviceAutocast cpu_state{false, DType::bf16};
thread_local DeviceAutocast cuda_state{false, DType::f16};

DeviceAutocast& state(DeviceType d) { return d == DeviceType::CPU ? cpu_state : cuda_state; }
}  // namespace

DType default_autocast_dtype(DeviceType device) { return device == DeviceType::CPU ? DType::bf16 : DType::f16; }

bool autocast_enabled(DeviceType device) { return state(device).enabled; }
DType autocast_dtype(DeviceType device) { return state(device).dtype; }

AutocastGuard::AutocastGuard(DeviceType device, DType dtype, bool enabled) : device_(device) {
  EMBER_CHECK(dtype == DType::f16 || dtype == DType::bf16, "autocast: dtype must be f16 or bf16, got ",
              dtype_name(dtype));
  DeviceAutocast& s = state(device);
  prev_enabled_ = s.enabled;
  prev_dtype_ = s.dtype;
  s.enabled = enabled;
  s.dtype = dtype;
}

AutocastGuard::AutocastGuard(AutocastGuard&& other) noexcept
    : device_(other.device_), prev_enabled_(other.prev_enabled_), prev_dtype_(other.prev_dtype_), active_(other.active_) {
  other.active_ = false;
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  DeviceAutocast& s = state(device_);
  s.enabled = prev_enabled_;
  s.dtype = prev_dtype_;
  // Leaving the last autocast region: the weight copies made in it are not reused.
  if (!cpu_state.enabled && !cuda_state.enabled) autocast::clear_cache();
}

namespace autocast {

bool active_for(const Tensor& x) { return x.defined() && state(x.device().type).enabled; }

SuspendGuard::SuspendGuard() : prev_cpu_(cpu_state.enabled), prev_cuda_(cuda_state.enabled) {
  cpu_state.enabled = cuda_state.enabled = false;
}
SuspendGuard::~SuspendGuard() {
  cpu_state.enabled = prev_cpu_;
  cuda_state.enabled = prev_cuda_;
}

}  // namespace autocast
}  // namespace ember
