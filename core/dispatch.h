// Device dispatch. core/native declares one dispatch slot per kernel family with the function type
// it calls; kernels/cpu and kernels/cuda fill the slot for their device at load time, so
// core never includes a kernel header (the arrows point down the stack).
//
//   core/native/foo.h:     EMBER_DECLARE_STUB(foo_stub, void (*)(const Tensor& out, const Tensor& in));
//   core/native/foo.cpp:   EMBER_DEFINE_STUB(foo_stub);   ...   foo_stub.call(x.device(), "foo")(out, x);
//   kernels/cpu/foo.cpp:   EMBER_REGISTER_KERNEL(foo_stub, CPU, &foo_cpu);
#pragma once
#include "core/device.h"
#include "core/error.h"

namespace ember {

template <typename Fn>
struct DispatchStub {
  Fn cpu = nullptr;
  Fn cuda = nullptr;
  Fn call(Device d, const char* op) const {
    Fn f = d.is_cpu() ? cpu : cuda;
    EMBER_CHECK(f != nullptr, op, ": no kernel for device ", d,
                d.is_cuda() ? " (Ember was built without CUDA, or this op has no CUDA kernel)" : "");
    return f;
  }
};

}  // namespace ember

#define EMBER_DECLARE_STUB(name, fn_type) \
  using name##_fn = fn_type;              \
  extern ::ember::DispatchStub<name##_fn> name
#define EMBER_DEFINE_STUB(name) ::ember::DispatchStub<name##_fn> name
#define EMBER_CONCAT_IMPL(a, b) a##b
#define EMBER_CONCAT(a, b) EMBER_CONCAT_IMPL(a, b)
#define EMBER_REGISTER_KERNEL(slot, DEVICE, fn)                               \
  static const bool EMBER_CONCAT(ember_registered_, __LINE__) = [] {          \
    slot.EMBER_DEVICE_FIELD_##DEVICE = fn;                                    \
    return true;                                                              \
  }()
#define EMBER_DEVICE_FIELD_CPU cpu
#define EMBER_DEVICE_FIELD_CUDA cuda
