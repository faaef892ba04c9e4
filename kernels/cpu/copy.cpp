// CPU copy (with dtype conversion and broadcasting) and fill.
#include <cstring>

#include "core/native/copy.h"
#include "core/strided_loop.h"
#include "core/type_dispatch.h"

namespace ember {
namespace {

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

void copy_cpu(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous() &&
      dst.shape() == src.shape()) {
    std::memcpy(dst.raw_data(), src.raw_data(), size_t(dst.numel()) * dst.element_size());
    return;
  }
  StridedLoop loop(dst.shape(), {dst, src});
  visit_all(dst.dtype(), "copy_", [&](auto to_tag) {
    using To = typename decltype(to_tag)::type;
    visit_all(src.dtype(), "copy_", [&](auto from_tag) {
      using From = typename decltype(from_tag)::type;
      unary_loop<To, From>(loop, [](From v) { return convert<To, From>(v); });
    });
  });
}

void fill_cpu(const Tensor& dst, double value) {
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
