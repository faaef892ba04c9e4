// The AMX instructions behind gemm_bf16_amx.h: the hardware tile backend of the blocking in
// gemm_bf16_amx_blocking.inc, and the request to Linux for the tile data state.
#include "kernels/cpu/gemm_bf16_amx.h"

#include <immintrin.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/cpu_features.h"
#include "core/error.h"
#include "kernels/cpu/aligned_buffer.h"
#include "kernels/cpu/amx_tile_config.h"
#include "kernels/cpu/gemm_bf16_amx_packing.h"

namespace ember::cpu {
namespace {

struct TilePermission {
  bool granted = false;
  std::string reason;  // why not, when refused
};

// Linux (5.16 and later) keeps the tile data state off until a process asks for it; the grant
// covers every thread of the process.
TilePermission request_tile_permission() {
  if (!cpu_features().amx_bf16) return {false, "this CPU has no AMX-BF16"};
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kArchReqXcompPerm = 0x1023;  // ARCH_REQ_XCOMP_PERM, <asm/prctl.h>
  constexpr long kXfeatureXtiledata = 18;     // XFEATURE_XTILEDATA
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) return {true, ""};
  const int err = errno;
  return {false, std::string("Linux refused the AMX tile data state (arch_prctl(ARCH_REQ_XCOMP_PERM, "
                             "XTILEDATA): ") +
                     std::strerror(err) + "; Linux 5.16 or later grants it)"};
#else
  return {false, "AMX tile permission is only requested on Linux"};
#endif
}

const TilePermission& tile_permission() {
  static const TilePermission permission = request_tile_permission();
  return permission;
}

}  // namespace

bool amx_tiles_usable() { return tile_permission().granted; }

std::string amx_tiles_unusable_reason() { return tile_permission().reason; }

}  // namespace ember::cpu

// AMX code, reached only once amx_tiles_usable() holds; everything below is compiled for it and
// nothing here is inline in a header another file could pick up.
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")
#if defined(__clang__)  // clang ignores the GCC pragma; this is its equivalent
#pragma clang attribute push(__attribute__((target("amx-tile,amx-bf16"))), apply_to = function)
#endif

namespace ember::cpu {
namespace {

// GCC's tile intrinsics are macros that paste the register number into the instruction's text,
// so each needs a literal: this picks the literal for a template argument.
#define EMBER_WITH_TILE(T, OP) \
  if constexpr (T == 0)        \
    OP(0);                     \
  else if constexpr (T == 1)   \
    OP(1);                     \
  else if constexpr (T == 2)   \
    OP(2);                     \
  else if constexpr (T == 3)   \
    OP(3);                     \
  else if constexpr (T == 4)   \
    OP(4);                     \
  else if constexpr (T == 5)   \
    OP(5);                     \
  else if constexpr (T == 6)   \
    OP(6);                     \
  else                         \
    OP(7)

// The tile operations as instructions. GCC's versions are asm statements that do not tell the
// compiler which memory they read (ldtilecfg names 8 of its 64 bytes, tileloadd none), so a
// compiler barrier before each makes every earlier store to the configuration and the packed
// buffers happen first.
class HardwareTiles {
 public:
  void configure(const amx::TileConfig& cfg) {
    __asm__ volatile("" ::: "memory");
    _tile_loadconfig(&cfg);
  }
  void release() { _tile_release(); }

  template <int T>
  void zero() {
    static_assert(T >= 0 && T < 8);
#define EMBER_TILE_ZERO(t) _tile_zero(t)
    EMBER_WITH_TILE(T, EMBER_TILE_ZERO);
#undef EMBER_TILE_ZERO
  }

  template <int T>
  void load(const void* base, int64_t stride) {
    static_assert(T >= 0 && T < 8);
    __asm__ volatile("" ::: "memory");
#define EMBER_TILE_LOAD(t) _tile_loadd(t, base, stride)
    EMBER_WITH_TILE(T, EMBER_TILE_LOAD);
#undef EMBER_TILE_LOAD
  }

  template <int T>
  void store(void* base, int64_t stride) {
    static_assert(T >= 0 && T < 8);
#define EMBER_TILE_STORE(t) _tile_stored(t, base, stride)
    EMBER_WITH_TILE(T, EMBER_TILE_STORE);
#undef EMBER_TILE_STORE
  }

  // The micro-kernel's four products, spelled out for the same reason.
  template <int C, int A, int B>
  void dot_bf16() {
    using namespace amx;
    if constexpr (C == kTileC00 && A == kTileA0 && B == kTileB0)
      _tile_dpbf16ps(0, 4, 6);
    else if constexpr (C == kTileC01 && A == kTileA0 && B == kTileB1)
      _tile_dpbf16ps(1, 4, 7);
    else if constexpr (C == kTileC10 && A == kTileA1 && B == kTileB0)
      _tile_dpbf16ps(2, 5, 6);
    else if constexpr (C == kTileC11 && A == kTileA1 && B == kTileB1)
      _tile_dpbf16ps(3, 5, 7);
    else
      static_assert(C < 0, "only the micro-kernel's four tile products are spelled out");
  }
};

#undef EMBER_WITH_TILE

static_assert(amx::kTileC00 == 0 && amx::kTileC01 == 1 && amx::kTileC10 == 2 && amx::kTileC11 == 3 &&
                  amx::kTileA0 == 4 && amx::kTileA1 == 5 && amx::kTileB0 == 6 && amx::kTileB1 == 7,
              "dot_bf16 spells the register numbers out");

#include "kernels/cpu/gemm_bf16_amx_blocking.inc"

template <typename Out>
void hardware_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const BFloat16* a,
                   int64_t lda, const BFloat16* b, int64_t ldb, float beta, Out* c, int64_t ldc) {
  EMBER_CHECK(amx_tiles_usable(), "gemm: the AMX bf16 kernel cannot run for m=", m, " n=", n, " k=", k, ": ",
              amx_tiles_unusable_reason());
  HardwareTiles tiles;
  amx_gemm(tiles, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

void gemm_bf16_amx_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta, float* c,
                          int64_t ldc) {
  hardware_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_bf16_amx_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta, BFloat16* c,
                          int64_t ldc) {
  hardware_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace ember::cpu

#if defined(__clang__)
#pragma clang attribute pop
#endif
#pragma GCC pop_options
