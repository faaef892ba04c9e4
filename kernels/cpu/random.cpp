// CPU random fills. Element i draws Philox(seed, offset + i), so the thread split is invisible.
#include <cmath>

#include "core/native/random.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"

namespace ember {
namespace {

// Box-Muller on two uniforms from one Philox draw; u1 is kept away from 0.
inline double normal_from(const std::array<uint32_t, 4>& r) {
  const double u1 = (double(r[0] >> 8) + 1.0) / 16777217.0;
  const double u2 = double(r[1] >> 8) / 16777216.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

void random_cpu(const Tensor& out, native::RandomKind kind, double a, double b, GeneratorState st) {
  visit_all(out.dtype(), "random", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = static_cast<T*>(out.raw_data());
    parallel_for(0, out.numel(), 16384, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const auto r = Philox::draw(st.seed, 0, st.offset + uint64_t(i));
        double v;
        switch (kind) {
          case native::RandomKind::Uniform:
            // Explicit fma so CPU and CUDA round identically. 24 random bits are exact in every float type, so the result stays below b
            // after rounding; f64 gets 53.
            v = std::is_same_v<T, double>
                    ? std::fma(b - a, double((uint64_t(r[0]) << 21) ^ uint64_t(r[1] >> 11)) / 9007199254740992.0, a)
                    : std::fma(b - a, double(Philox::to_uniform(r[0])), a);
            break;
          case native::RandomKind::Normal:
            v = std::fma(b, normal_from(r), a);  // explicit fma: the CUDA kernel computes the same
            break;
          default: {
            const uint64_t range = uint64_t(int64_t(b) - int64_t(a));
            const uint64_t x = (uint64_t(r[0]) << 32) | r[1];
            v = double(int64_t(a) + int64_t(x % range));
          }
        }
        if constexpr (std::is_same_v<T, bool>) {
          p[i] = v != 0;
        } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
          p[i] = T(float(v));
        } else {
          p[i] = static_cast<T>(v);
        }
      }
    });
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::random_stub, CPU, &random_cpu);

}  // namespace ember
