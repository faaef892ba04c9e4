// CPU loss unscaling: one pass that multiplies a gradient by 1/scale in place and checks the
// results for inf/NaN. The check reads the exponent bits of the value written, so it also
// catches a finite gradient that overflows its dtype on unscaling, and it stays correct under
// any floating-point compile flags.
#include <atomic>
#include <bit>
#include <cstdint>

#include "core/native/amp.h"
#include "core/strided_loop.h"
#include "core/type_dispatch.h"

namespace ember {
namespace {

// 1 when all exponent bits are set (inf or NaN), else 0. An integer, not a bool: OR-ing
// integers is a reduction the compiler vectorises, OR-ing bools is not.
inline uint32_t non_finite(float v) { return (std::bit_cast<uint32_t>(v) & 0x7f800000u) == 0x7f800000u; }
inline uint32_t non_finite(double v) {
  return (std::bit_cast<uint64_t>(v) & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
}
inline uint32_t non_finite(Half v) { return (v.bits & 0x7c00u) == 0x7c00u; }
inline uint32_t non_finite(BFloat16 v) { return (v.bits & 0x7f80u) == 0x7f80u; }

// Unscales n elements `stride` bytes apart; returns whether any result is not finite.
template <typename T>
bool unscale_row(char* base, int64_t stride, int64_t n, acc_t<T> inv) {
  uint32_t bad = 0;
  if (stride == int64_t(sizeof(T))) {
    T* g = reinterpret_cast<T*>(base);
    for (int64_t i = 0; i < n; ++i) {
      const T r = T(acc_t<T>(g[i]) * inv);
      g[i] = r;
      bad |= non_finite(r);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      T* g = reinterpret_cast<T*>(base + i * stride);
      const T r = T(acc_t<T>(*g) * inv);
      *g = r;
      bad |= non_finite(r);
    }
  }
  return bad != 0;
}

void amp_unscale_cpu(const Tensor& grad, const Tensor& found_inf, double inv_scale) {
  StridedLoop loop(grad.shape(), {grad});
  std::atomic<bool> any_bad{false};
  visit_floating(grad.dtype(), "amp_unscale_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const acc_t<T> inv = acc_t<T>(inv_scale);
    loop.run([&](char** p, const int64_t* s, int64_t n) {
      if (unscale_row<T>(p[0], s[0], n, inv)) any_bad.store(true, std::memory_order_relaxed);
    });
  });
  if (any_bad.load()) found_inf.data_ptr<float>()[0] = 1.0f;
}

}  // namespace

EMBER_REGISTER_KERNEL(native::amp_unscale_stub, CPU, &amp_unscale_cpu);

}  // namespace ember
