// CPU copy (with dtype conversion and broadcasting) and fill.
//
// Conversions between the floating types run 8 lanes at a time (kernels/cpu/vec_half.h: bf16 is
// converted bitwise, f16 with F16C), so autocast's casts cost about one pass of memory traffic.
// Large same-dtype copies and zero fills are split across the pool's threads.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/native/copy.h"
#include "core/parallel.h"
#include "core/strided_loop.h"
#include "core/type_dispatch.h"
#include "kernels/cpu/vec_half.h"

namespace ember {
namespace {

constexpr int64_t kBytesPerTask = 1 << 18;

template <typename To, typename From>
To convert(From v) {
  if constexpr (std::is_same_v<To, bool>) {
    return static_cast<acc_t<From>>(v) != acc_t<From>(0);
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    return To(float(static_cast<acc_t<From>>(v)));
  } else {
    return static_cast<To>(static_cast<acc_t<From>>(v));
  }
}

// float, bf16 and f16 convert through float lanes.
template <typename T>
constexpr bool is_lane_type_v = std::is_same_v<T, float> || std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>;

void parallel_memcpy(void* dst, const void* src, int64_t bytes) {
  parallel_for(0, bytes, kBytesPerTask, [&](int64_t b, int64_t e) {
    std::memcpy(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b, size_t(e - b));
  });
}

template <typename To, typename From>
void convert_strided(const StridedLoop& loop) {
  loop.run([](char** p, const int64_t* s, int64_t n) {
    if constexpr (is_lane_type_v<To> && is_lane_type_v<From> && !std::is_same_v<To, From>) {
      if (s[0] == int64_t(sizeof(To)) && s[1] == int64_t(sizeof(From))) {
        cpu::vec8::convert_row(reinterpret_cast<To*>(p[0]), reinterpret_cast<const From*>(p[1]), n);
        return;
      }
    }
    if (s[0] == int64_t(sizeof(To)) && s[1] == int64_t(sizeof(From))) {
      To* o = reinterpret_cast<To*>(p[0]);
      const From* a = reinterpret_cast<const From*>(p[1]);
      for (int64_t i = 0; i < n; ++i) o[i] = convert<To, From>(a[i]);
    } else if (s[0] == int64_t(sizeof(To)) && s[1] == 0) {
      To* o = reinterpret_cast<To*>(p[0]);
      const To v = convert<To, From>(*reinterpret_cast<const From*>(p[1]));
      for (int64_t i = 0; i < n; ++i) o[i] = v;
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<To*>(p[0] + i * s[0]) = convert<To, From>(*reinterpret_cast<const From*>(p[1] + i * s[1]));
    }
  });
}

void copy_cpu(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous() && dst.shape() == src.shape()) {
    parallel_memcpy(dst.raw_data(), src.raw_data(), dst.numel() * int64_t(dst.element_size()));
    return;
  }
  StridedLoop loop(dst.shape(), {dst, src});
  visit_all(dst.dtype(), "copy_", [&](auto to_tag) {
    using To = typename decltype(to_tag)::type;
    visit_all(src.dtype(), "copy_", [&](auto from_tag) {
      using From = typename decltype(from_tag)::type;
      convert_strided<To, From>(loop);
    });
  });
}

void fill_cpu(const Tensor& dst, double value) {
  if (value == 0.0 && !std::signbit(value) && dst.is_contiguous()) {
    // All-zero bits are +0 in every dtype.
    char* p = static_cast<char*>(dst.raw_data());
    parallel_for(0, dst.numel() * int64_t(dst.element_size()), kBytesPerTask,
                 [&](int64_t b, int64_t e) { std::memset(p + b, 0, size_t(e - b)); });
    return;
  }
  StridedLoop loop(dst.shape(), {dst});
  visit_all(dst.dtype(), "fill_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = convert<T, double>(value);
    loop.run([&](char** p, const int64_t* s, int64_t n) {
      if (s[0] == sizeof(T)) {
        T* o = reinterpret_cast<T*>(p[0]);
        for (int64_t i = 0; i < n; ++i) o[i] = v;
      } else {
        for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
      }
    });
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::copy_stub, CPU, &copy_cpu);
EMBER_REGISTER_KERNEL(native::fill_stub, CPU, &fill_cpu);

}  // namespace ember
