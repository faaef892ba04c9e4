// The ten rounds of Philox4x32-10, shared by the host generator (core/rng.cpp) and the CUDA
// kernels (kernels/cuda/philox.cuh), so that a seeded draw gives the same words on either device.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define EMBER_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define EMBER_HOST_DEVICE inline
#endif

namespace ember {

// Replaces the counter words c[0..3] (c[0] lowest) by their Philox4x32-10 output for `key`.
EMBER_HOST_DEVICE void philox_rounds(uint32_t (&c)[4], uint64_t key) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kMul0) * c[0], p1 = uint64_t(kMul1) * c[2];
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c[1] ^ k0, n2 = uint32_t(p0 >> 32) ^ c[3] ^ k1;
    c[1] = uint32_t(p1);
    c[3] = uint32_t(p0);
    c[0] = n0;
    c[2] = n2;
    k0 += kW0;
    k1 += kW1;
  }
}

}  // namespace ember
