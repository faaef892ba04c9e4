// CPU random fills. Element i draws Philox(seed, offset + i), so the thread split is invisible.
// Normals and uniforms stored as f32, bf16 or f16 take the AVX2 fills of kernels/cpu/random_lanes.h,
// which give the scalar formulas' bits (kernels/cpu/random_draws.h).
#include <algorithm>
#include <cmath>

#include "core/native/random.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/random_draws.h"
#include "kernels/cpu/random_lanes.h"
#include "kernels/cpu/vec_half.h"

namespace ember {
namespace {

constexpr int64_t kChunk = 1024;  // floats filled, then converted, at a time

// Elements begin .. end - 1 of a normal (a mean, b std) or uniform [a, b) fill with the AVX2
// lanes; false for the kinds and types they do not serve.
template <typename T>
bool fill_lanes(T* p, native::RandomKind kind, double a, double b, GeneratorState st, int64_t begin, int64_t end) {
#if defined(__AVX2__)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    if (kind != native::RandomKind::Normal && kind != native::RandomKind::Uniform) return false;
    auto fill = [&](float* out, int64_t first, int64_t n) {
      if (kind == native::RandomKind::Normal) {
        cpu::normal_fill_f32(out, st, first, n, a, b);
      } else {
        cpu::uniform_fill_f32(out, st, first, n, a, b);
      }
    };
    if constexpr (std::is_same_v<T, float>) {
      fill(p + begin, begin, end - begin);
    } else {
      float buf[kChunk];
      for (int64_t i = begin; i < end; i += kChunk) {
        const int64_t n = std::min(kChunk, end - i);
        fill(buf, i, n);
        cpu::vec8::convert_row(p + i, buf, n);
      }
    }
    return true;
  }
#endif
  (void)p, (void)kind, (void)a, (void)b, (void)st, (void)begin, (void)end;
  return false;
}

void random_cpu(const Tensor& out, native::RandomKind kind, double a, double b, GeneratorState st) {
  visit_all(out.dtype(), "random", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = static_cast<T*>(out.raw_data());
    parallel_for(0, out.numel(), 16384, [&](int64_t begin, int64_t end) {
      if (fill_lanes(p, kind, a, b, st, begin, end)) return;
      for (int64_t i = begin; i < end; ++i) {
        const auto r = Philox::draw(st.seed, 0, st.offset + uint64_t(i));
        double v;
        switch (kind) {
          case native::RandomKind::Uniform:
            // f64 gets 53 random bits, the narrower types 24 (kernels/cpu/random_draws.h)
            v = std::is_same_v<T, double>
                    ? std::fma(b - a, double((uint64_t(r[0]) << 21) ^ uint64_t(r[1] >> 11)) / 9007199254740992.0, a)
                    : cpu::uniform_value(r, a, b);
            break;
          case native::RandomKind::Normal:
            v = cpu::normal_value(r, a, b);
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
