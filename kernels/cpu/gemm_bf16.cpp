// bf16 GEMM (see gemm.h and gemm_bf16.h): C = alpha * op(A) * op(B) + beta * C with bfloat16
// A and B, products accumulated in f32, C in bf16 or f32. Three paths:
//
// onednn: oneDNN's matmul primitive with bf16 source and weights, run band by band on Ember's
// pool threads like the f32 GEMM. A primitive is specialised to one shape, layout and
// alpha/beta, and creating one costs far more than running a small product, so primitives live
// in a small LRU cache shared by every thread. oneDNN threads with OpenMP; Ember already splits
// the work, so each call runs with OpenMP capped at one thread on the calling thread.
//
// avx512bf16: Ember's blocked vdpbf16ps kernel (gemm_bf16_avx512.cpp), band by band.
//
// amx: Ember's AMX tile kernel (gemm_bf16_amx.cpp), band by band. Forced only (EMBER_BF16_GEMM=amx
// or set_bf16_gemm_path) until bench_matmul's bf16_amx rows have been measured on an AMX machine:
// the aim is 60% of the tdpbf16ps peak on one core at the BERT shapes below, including the
// dY^T @ X weight gradient that oneDNN 2.6 sends to a kernel without AMX.
//
// widened: Ember's packed GEMM (gemm_packed.h), which widens blocks of the operands to f32 as it
// packs them and runs its f32 micro-kernels. (Until it existed the operands were converted
// whole and sent to oneDNN's sgemm: the "widened" column of the table below.)
//
// Measured with bench_matmul's bf16_* rows (GFLOP/s, median of 5 to 10 alternating runs; the
// machine is shared, so single runs vary by up to 30%) on an Intel Xeon with AVX512-BF16 and
// AMX, 2 cores, oneDNN 2.6.3. "onednn, no AMX" ran with DNNL_MAX_CPU_ISA=AVX512_CORE_BF16, which
// stands in for a CPU with AVX512-BF16 but no AMX:
//
//   shape MxKxN                          threads  avx512bf16  onednn, no AMX  widened  onednn AMX
//   fc1     2048x256x1024   x @ W^T         1          89           97           117        857
//   fc2     2048x1024x256   x @ W^T         1          92           93           113        879
//   dW      256x2048x1024   dY^T @ X        1          81           89           107        505
//   attn    64 x 128x128x64 bmm             1          85           66            86        237
//   square  1024x1024x1024                  1          91           94           128        680
//   fc1                                     2         178          189           182        964
//   fc2                                     2         183          184           198       1517
//   dW                                      2         162          173           186       1076
//   attn                                    2         162          108           157        344
//   square                                  2         175          179           213       1391
//   n^3, n = 16 / 24 / 32 (direct calls)    1     31 / 53 / 80      -     15 / 26 / 50         -
//
// On this CPU vdpbf16ps issues once every two cycles against two f32 FMAs per cycle, so it
// delivers half the FMA flops (bf16_dot_product_speedup() = 0.5, where a core that issues it as
// often as an FMA gives 2). Both vdpbf16ps kernels stop near that ceiling, about 110 GFLOP/s per
// core at 3.4 GHz (Ember's register tile alone reaches 97% of it, whole products 75-90%), below
// the 50-65% of the FMA peak that the f32 GEMM behind the widened path reaches. Ember's kernel
// is within 10% of oneDNN's AVX512-BF16 kernel on the linear shapes, 1.3-1.5x faster on the
// batched attention shape, and 2x faster than the widened path on small products.
//
// Dispatch (automatic_path; EMBER_BF16_GEMM overrides it):
//   AMX: onednn, 4-8x faster than anything else. Products under kMinPrimitiveWork run on
//     avx512bf16; odd k (see native_kernel_safe) on the faster of avx512bf16 and widened.
//   AVX512-BF16 without AMX: avx512bf16 where bf16_dot_product_speedup() >= 1, i.e. on cores
//     that issue vdpbf16ps about as often as an FMA; elsewhere widened, the winner measured here
//     on all but the attention shape, where it ties with Ember's kernel. oneDNN's AVX512-BF16
//     kernel is not chosen: never clearly ahead of Ember's, and far behind on attention.
//   AVX-512 without bf16, and EMBER_CPU_CAPABILITY=avx2: widened.
#include <dnnl.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/forced_choice.h"
#include "core/parallel.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/gemm_bf16_amx.h"
#include "kernels/cpu/gemm_bf16_avx512.h"
#include "kernels/cpu/gemm_bands.h"
#include "kernels/cpu/gemm_packed.h"
#include "kernels/cpu/onednn_runtime.h"

namespace ember::cpu {
namespace {

// Below this many multiply-adds a primitive does not pay: running a cached one costs about
// 2.5 us (measured: 32^3 takes 2.5 us on oneDNN against 0.8 us on Ember's AVX512-BF16 kernel
// and 1.6 us widened; 48^3 3.2 us against 2.9 and 3.4), and creating one for a shape seen once
// costs far more.
constexpr double kMinPrimitiveWork = 40.0 * 40.0 * 40.0;
// Distinct (shape, layout, alpha, beta) combinations kept; a model uses a few dozen.
constexpr size_t kCacheCapacity = 256;

// ---- widened path

// The packed GEMM widens bf16 blocks to f32 as it packs them (no operand is converted whole,
// nothing is allocated per call) and rounds a bf16 C once.
template <typename Out>
void widened_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const BFloat16* a,
                  int64_t lda, const BFloat16* b, int64_t ldb, float beta, Out* c, int64_t ldc) {
  packed_gemm<BFloat16, BFloat16, Out>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                                       packed_kernel_for_this_cpu());
}

// ---- native path

struct PrimitiveKey {
  int64_t m, n, k, lda, ldb, ldc;
  bool trans_a, trans_b, f32_out;
  uint32_t alpha_bits, beta_bits;
  bool operator==(const PrimitiveKey&) const = default;
};

struct PrimitiveKeyHash {
  size_t operator()(const PrimitiveKey& key) const {
    size_t h = 0;
    auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    for (int64_t v : {key.m, key.n, key.k, key.lda, key.ldb, key.ldc}) mix(uint64_t(v));
    mix(uint64_t(key.trans_a) | uint64_t(key.trans_b) << 1 | uint64_t(key.f32_out) << 2);
    mix(uint64_t(key.alpha_bits) << 32 | key.beta_bits);
    return h;
  }
};

struct CachedPrimitive {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul primitive;
  size_t scratchpad_bytes = 0;
  // False when oneDNN has only its reference kernel for this case: the widened path is faster.
  bool usable = false;
};

CachedPrimitive create_primitive(const PrimitiveKey& key) {
  using dims = dnnl::memory::dims;
  using dt = dnnl::memory::data_type;
  // Row-major m x k and k x n views; a transposed operand is the same view with swapped strides.
  const dnnl::memory::desc src({key.m, key.k}, dt::bf16, key.trans_a ? dims{1, key.lda} : dims{key.lda, 1});
  const dnnl::memory::desc weights({key.k, key.n}, dt::bf16, key.trans_b ? dims{1, key.ldb} : dims{key.ldb, 1});
  const dnnl::memory::desc dst({key.m, key.n}, key.f32_out ? dt::f32 : dt::bf16, dims{key.ldc, 1});
  dnnl::primitive_attr attr;
  // Scratch memory comes from the executing thread, so a primitive can run on many threads at once.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const float alpha = std::bit_cast<float>(key.alpha_bits), beta = std::bit_cast<float>(key.beta_bits);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  CachedPrimitive made;
  OmpThreads one_thread(1);
  made.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst), attr, onednn_engine(),
                                         /*allow_empty=*/true);
  if (!made.pd) return made;
  if (std::string_view(made.pd.impl_info_str()).starts_with("ref")) return made;
  made.primitive = dnnl::matmul(made.pd);
  made.scratchpad_bytes = made.pd.scratchpad_desc().get_size();
  made.usable = true;
  return made;
}

using MatmulCache = PrimitiveCache<PrimitiveKey, CachedPrimitive, PrimitiveKeyHash>;

MatmulCache& primitive_cache() {
  static MatmulCache* cache = new MatmulCache(kCacheCapacity);  // outlives pool threads at exit
  return *cache;
}

void run_primitive(const CachedPrimitive& p, const BFloat16* a, const BFloat16* b, void* c) {
  dnnl::stream& stream = onednn_thread_stream();
  const dnnl::engine& engine = onednn_engine();
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, dnnl::memory(p.pd.src_desc(), engine, const_cast<BFloat16*>(a))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(p.pd.weights_desc(), engine, const_cast<BFloat16*>(b))},
      {DNNL_ARG_DST, dnnl::memory(p.pd.dst_desc(), engine, c)}};
  if (p.scratchpad_bytes > 0)
    args.emplace(DNNL_ARG_SCRATCHPAD,
                 dnnl::memory(p.pd.scratchpad_desc(), engine, onednn_thread_scratchpad(p.scratchpad_bytes)));
  OmpThreads one_thread(1);
  p.primitive.execute(stream, args);
  stream.wait();
}

// oneDNN 2.6.3's AMX bf16 matmul dies with SIGILL (a tile shape its kernel did not configure)
// for some odd inner dimensions: k = 63 with m % 64 in [1, 16] and m > 64, and k % 32 == 31
// past about 2300 (found by scanning a few thousand shapes in child processes; no even k
// failed). Odd k, rare in models, takes the fallback.
bool native_kernel_safe(int64_t k) { return k % 2 == 0; }

// Whether Ember's vdpbf16ps kernel beats the widened path on large products: where vdpbf16ps
// delivers at least the flops of f32 FMAs. Measured here, whole products reach 75-90% of the
// vdpbf16ps peak and the f32 GEMM 50-65% of the FMA peak, so the threshold leaves a margin.
bool dot_product_kernel_wins() {
  return bf16_gemm_path_available(Bf16GemmPath::Avx512Bf16) && bf16_dot_product_speedup() >= 1.0;
}

// Where the oneDNN path sends what oneDNN should not run: small products to Ember's kernel
// where the CPU has AVX512-BF16 (it beats the widened path there at any vdpbf16ps rate), larger
// ones (odd k, or no optimised oneDNN kernel) to the faster of that kernel and the widened path.
bool fallback_to_own_kernel(int64_t m, int64_t n, int64_t k) {
  return double(m) * double(n) * double(k) < kMinPrimitiveWork
             ? bf16_gemm_path_available(Bf16GemmPath::Avx512Bf16)
             : dot_product_kernel_wins();
}

// One of Ember's kernels (Kernel: Avx512Bf16 or Amx), one band per pool thread.
template <Bf16GemmPath Kernel = Bf16GemmPath::Avx512Bf16, typename Out>
void own_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const BFloat16* a, int64_t lda,
              const BFloat16* b, int64_t ldb, float beta, Out* c, int64_t ldc) {
  static_assert(Kernel == Bf16GemmPath::Avx512Bf16 || Kernel == Bf16GemmPath::Amx);
  gemm_in_bands(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc,
                [&](int64_t mb, int64_t nb, const BFloat16* ab, const BFloat16* bb, Out* cb) {
                  if constexpr (Kernel == Bf16GemmPath::Amx)
                    gemm_bf16_amx_serial(trans_a, trans_b, mb, nb, k, alpha, ab, lda, bb, ldb, beta, cb, ldc);
                  else
                    gemm_bf16_avx512_serial(trans_a, trans_b, mb, nb, k, alpha, ab, lda, bb, ldb, beta, cb, ldc);
                });
}

// One band through oneDNN, on the calling thread.
template <typename Out>
void onednn_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const BFloat16* a,
                   int64_t lda, const BFloat16* b, int64_t ldb, float beta, Out* c, int64_t ldc) {
  const PrimitiveKey key{m,       n,       k,
                         lda,     ldb,     ldc,
                         trans_a, trans_b, std::is_same_v<Out, float>,
                         std::bit_cast<uint32_t>(alpha), std::bit_cast<uint32_t>(beta)};
  std::shared_ptr<const CachedPrimitive> p;
  try {
    p = primitive_cache().get(key, create_primitive);
  } catch (const dnnl::error& e) {
    EMBER_FAIL("gemm: oneDNN could not create a bf16 matmul for m=", m, " n=", n, " k=", k, " lda=", lda,
               " ldb=", ldb, " ldc=", ldc, ": ", e.what());
  }
  if (!p->usable) {
    if (fallback_to_own_kernel(m, n, k))
      gemm_bf16_avx512_serial(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else
      widened_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  try {
    run_primitive(*p, a, b, c);
  } catch (const dnnl::error& e) {
    EMBER_FAIL("gemm: oneDNN bf16 matmul failed for m=", m, " n=", n, " k=", k, " lda=", lda, " ldb=", ldb,
               " ldc=", ldc, ": ", e.what());
  }
}

// ---- path selection

ForcedChoice<Bf16GemmPath>& forced_path() {
  static ForcedChoice<Bf16GemmPath> forced("EMBER_BF16_GEMM", {{"onednn", Bf16GemmPath::OneDnn},
                                                                {"avx512bf16", Bf16GemmPath::Avx512Bf16},
                                                                {"widened", Bf16GemmPath::Widened},
                                                                {"amx", Bf16GemmPath::Amx}});
  return forced;
}

// The measured choice (numbers at the top of this file). Never amx: not measured yet.
Bf16GemmPath automatic_path() {
  if (cpu_capability() != CpuCapability::Avx512) return Bf16GemmPath::Widened;
  if (cpu_features().amx_bf16) return Bf16GemmPath::OneDnn;
  return dot_product_kernel_wins() ? Bf16GemmPath::Avx512Bf16 : Bf16GemmPath::Widened;
}

template <typename Out>
void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const BFloat16* a,
               int64_t lda, const BFloat16* b, int64_t ldb, float beta, Out* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) {
    scale_by_beta(m, n, beta, c, ldc);
    return;
  }
  switch (bf16_gemm_path()) {
    case Bf16GemmPath::Widened:
      widened_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    case Bf16GemmPath::Avx512Bf16:
      own_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    case Bf16GemmPath::Amx:
      own_gemm<Bf16GemmPath::Amx>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    case Bf16GemmPath::OneDnn:
      if (double(m) * double(n) * double(k) < kMinPrimitiveWork || !native_kernel_safe(k)) {
        if (fallback_to_own_kernel(m, n, k))
          own_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        else
          widened_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
      }
      gemm_in_bands(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc,
                    [&](int64_t mb, int64_t nb, const BFloat16* ab, const BFloat16* bb, Out* cb) {
                      onednn_serial(trans_a, trans_b, mb, nb, k, alpha, ab, lda, bb, ldb, beta, cb, ldc);
                    });
      return;
  }
}

}  // namespace

const char* bf16_gemm_path_name(Bf16GemmPath path) {
  switch (path) {
    case Bf16GemmPath::OneDnn: return "onednn";
    case Bf16GemmPath::Avx512Bf16: return "avx512bf16";
    case Bf16GemmPath::Widened: return "widened";
    case Bf16GemmPath::Amx: return "amx";
  }
  return "unknown";
}

bool bf16_gemm_path_available(Bf16GemmPath path) {
  switch (path) {
    case Bf16GemmPath::OneDnn: return cpu_capability() == CpuCapability::Avx512;
    case Bf16GemmPath::Avx512Bf16: return cpu_capability() == CpuCapability::Avx512 && cpu_features().avx512_bf16;
    case Bf16GemmPath::Widened: return true;
    case Bf16GemmPath::Amx:
      return cpu_capability() == CpuCapability::Avx512 && cpu_features().amx_bf16 && amx_tiles_usable();
  }
  return false;
}

namespace {

// Why `path` cannot run here, for the errors below.
std::string unavailable_reason(Bf16GemmPath path) {
  std::string why = std::string("this CPU at capability ") + cpu_capability_name(cpu_capability()) +
                    " cannot run the " + bf16_gemm_path_name(path) + " bf16 GEMM";
  if (path == Bf16GemmPath::Amx && cpu_capability() == CpuCapability::Avx512 && cpu_features().amx_bf16)
    why += ": " + amx_tiles_unusable_reason();
  return why;
}

}  // namespace

Bf16GemmPath bf16_gemm_path() {
  const std::optional<Bf16GemmPath> forced = forced_path().get();
  if (!forced) return automatic_path();
  const Bf16GemmPath path = *forced;
  EMBER_CHECK(bf16_gemm_path_available(path), "gemm: the ", bf16_gemm_path_name(path),
              " bf16 GEMM was forced (EMBER_BF16_GEMM or set_bf16_gemm_path) but ", unavailable_reason(path));
  return path;
}

void set_bf16_gemm_path(std::optional<Bf16GemmPath> path) {
  if (path)
    EMBER_CHECK(bf16_gemm_path_available(*path), "set_bf16_gemm_path: ", unavailable_reason(*path));
  forced_path().set(path);
}

std::string onednn_cpu_isa_name() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic: return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "unknown";
  }
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const BFloat16* a, int64_t lda,
          const BFloat16* b, int64_t ldb, float beta, BFloat16* c, int64_t ldc) {
  gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_bias(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const BFloat16* a, int64_t lda,
               const BFloat16* b, int64_t ldb, const BFloat16* bias, BFloat16* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k > 0 && bf16_gemm_path() == Bf16GemmPath::Widened) {
    packed_gemm<BFloat16, BFloat16, BFloat16>(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc,
                                              packed_kernel_for_this_cpu(), bias);
    return;
  }
  parallel_for(0, m, std::max<int64_t>(1, 16384 / n),
               [&](int64_t r0, int64_t r1) { seed_rows_with_bias(r1 - r0, n, bias, c + r0 * ldc, ldc); });
  gemm_bf16(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, c, ldc);
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const BFloat16* a, int64_t lda,
          const BFloat16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace ember::cpu
