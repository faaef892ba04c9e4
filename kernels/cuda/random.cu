// CUDA random fills: the same Philox4x32-10 stream and the same transforms as
// kernels/cpu/random.cpp, so element i of a seeded draw is the same number on either device.
// Uniform and integer draws match bit for bit; normal draws go through log and cos, whose
// CUDA versions may differ from the host's in the last bit of a double.
#include <cstdint>
#include <type_traits>

#include "core/native/random.h"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/philox.cuh"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember {
namespace {

using native::RandomKind;
constexpr int kThreads = 256;

// The host evaluates `a + w * u` with one rounding (GCC contracts it into an FMA on the
// x86-64-v3 baseline); fma() here keeps the two devices bit-identical for any range.
__device__ __forceinline__ double affine(double a, double w, double u) { return fma(w, u, a); }

template <typename T>
__device__ __forceinline__ double draw(RandomKind kind, double a, double b, const uint4& r) {
  switch (kind) {
    case RandomKind::Uniform:
      if constexpr (std::is_same_v<T, double>) {
        const uint64_t bits53 = (uint64_t(r.x) << 21) ^ uint64_t(r.y >> 11);
        return affine(a, b - a, double(bits53) / 9007199254740992.0);
      } else {
        // 24 bits are exact in every float type, so the value stays below b after rounding.
        return affine(a, b - a, double(float(r.x >> 8) * (1.0f / 16777216.0f)));
      }
    case RandomKind::Normal: {
      // Box-Muller on two uniforms of one draw; u1 is kept away from 0.
      const double u1 = (double(r.x >> 8) + 1.0) / 16777217.0;
      const double u2 = double(r.y >> 8) / 16777216.0;
      const double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
      return affine(a, b, z);
    }
    default: {
      const uint64_t range = uint64_t(int64_t(b) - int64_t(a));
      const uint64_t x = (uint64_t(r.x) << 32) | r.y;
      return double(int64_t(a) + int64_t(x % range));
    }
  }
}

template <typename T>
__global__ void random_kernel(T* out, int64_t n, RandomKind kind, double a, double b, uint64_t seed,
                              uint64_t offset) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double v = draw<T>(kind, a, b, cuda::philox(seed, offset + uint64_t(i)));
    if constexpr (std::is_same_v<T, bool>) {
      out[i] = v != 0.0;
    } else if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
      out[i] = cuda::Acc<T>::store(float(v));
    } else {
      out[i] = static_cast<T>(v);
    }
  }
}

void random_cuda(const Tensor& out, RandomKind kind, double a, double b, GeneratorState st) {
  EMBER_CHECK(out.is_contiguous(), "random: output must be contiguous");
  cuda::DeviceGuard guard(out.device(), "random");
  const int64_t n = out.numel();
  cuda::visit_device_type(out.dtype(), "random", [&](auto tag) {
    using T = typename decltype(tag)::type;
    random_kernel<T><<<cuda::grid_for(n, kThreads), kThreads, 0, cuda::current_stream()>>>(
        static_cast<T*>(out.raw_data()), n, kind, a, b, st.seed, st.offset);
  });
  EMBER_CUDA_CHECK_LAUNCH();
}

}  // namespace

EMBER_REGISTER_KERNEL(native::random_stub, CUDA, &random_cuda);

}  // namespace ember
