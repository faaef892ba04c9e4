// The packed GEMM's blocking, packing and edges (gemm_packed.h); the micro-kernels live in
// gemm_packed_avx2.cpp and gemm_packed_avx512.cpp.
//
// Loops, outermost first (BLIS's order for a kernel whose tile rows come from broadcasts of A
// and whose tile columns are vectors of B):
//   jc  columns of C, nc at a time             B block (kc x nc, packed) stays in L3
//   g   row groups (bf16 C over several chunks only: the rows its f32 staging block holds)
//   pc  the inner dimension, chunk by chunk     B block packed here
//   ic  rows of C, mc at a time                 A block (mc x kc, packed) stays in L2
//   jr  one column panel of B (kc x kCols)      stays in L1 while...
//   ir  ...each row panel of A streams past it
// Packed A: row panels of kRows rows, each kc steps of kRows values. Packed B: column panels of
// kCols columns, kc steps of kCols values. Rows and columns past the edge of C are packed as
// zeros, so edge tiles run the full micro-kernel (into a scratch tile) like any other.
//
// Measured with bench_matmul's packed/ rows (GFLOP/s, median of 6 runs over two sessions at 1
// thread, of 3 at 2 threads; beta = 0, bf16 rows with bf16 C) on an AMD EPYC Zen 3 VM, 2 cores,
// AVX2 + FMA, no AVX-512, oneDNN 2.6.3. The f32 FMA peak (build/bench/machine_limits) is
// 101 GFLOP/s on one core and 197 on two; the AVX2 micro-kernel alone, with its panels in L1,
// reaches 96 (kc = 256). 2048 tokens; fwd X W^T, dgrad dY W, wgrad dY^T X:
//
//   shape MxKxN           layout  packed f32  oneDNN sgemm  packed bf16  widened bf16
//   2048x256x1024          fwd        94           93            90           79
//   2048x1024x256          dgrad      83           77            87           79
//   1024x2048x256          wgrad      84           40            86           40
//   2048x1024x256          fwd        90           84            89           77
//   2048x256x1024          dgrad      96           94            92           87
//   256x2048x1024          wgrad      85           45            88           37
//   2048x768x3072          fwd        92           92            90           87
//   2048x3072x768          dgrad      94           93            91           87
//   3072x2048x768          wgrad      89           90            91           86
//   2048x3072x768          fwd        93           92            91           86
//   2048x768x3072          dgrad      91           89            89           85
//   768x2048x3072          wgrad      88           86            85           81
//   2048x256x30522 (MLM)   fwd        87           92            87           56
//   2048x30522x256 (MLM)   dgrad      80           78            80           52
//   30522x2048x256 (MLM)   wgrad      82           70            77           50
//   2 threads (oneDNN: its own OpenMP threads; in bands on Ember's pool, as cpu::gemm, in brackets)
//   2048x768x3072          fwd       176        169 (168)         168          160
//   2048x3072x768          dgrad     181        169 (174)         178          163
//   3072x2048x768          wgrad     172        134 (167)         117*         161
//   2048x256x30522 (MLM)   fwd       182        153 (132)         111*          85
//   2048x30522x256 (MLM)   dgrad     169        125 (155)         166           72
//   30522x2048x256 (MLM)   wgrad     153        107 (128)         142           49
//   * runs disturbed by other work on the machine; repeated alone, fwd MLM bf16 gave 162.
//
// One core: packed f32 runs at 79-95% of the FMA peak, level with oneDNN's sgemm (within the
// few percent of noise here) on most shapes, 2x faster on the small weight gradients (where
// oneDNN's transposed-A path drops to 40%), 5% slower on the MLM decoder's forward product.
// packed bf16 stays within a few percent of packed f32 (its packing widens as it goes, and
// the A operand is half the bytes), 1.05-1.2x the widened path as it was (whole operands converted to f32 for oneDNN's
// sgemm; the "widened bf16" column) on the bert-base shapes and 1.5-2.4x on the weight
// gradients and the decoder, where that allocated 250 MB of f32 per decoder product. The
// widened bf16 path now runs on this GEMM (gemm_bf16.cpp).
#include "kernels/cpu/gemm_packed.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "core/cpu_features.h"
#include "core/error.h"
#include "kernels/cpu/aligned_buffer.h"
#include "kernels/cpu/gemm_bands.h"

namespace ember::cpu {
namespace {

// ---- blocking
//
// Cache sizes assumed (the Zen 3 core measured, from /sys/devices/system/cpu/cpu0/cache and
// lscpu): L1d 32 KiB 8-way, L2 512 KiB 8-way per core, L3 32 MiB 16-way shared. Intel cores
// since Skylake have the same L1 (48 KiB from Ice Lake) and L2 of 1-2 MiB, so the same blocks fit.
// Sweeps of one constant at a time (best of 10 runs, thread CPU time, f32 fwd/dgrad/wgrad at
// 2048x256x1024, 2048x1024x256, 1024x2048x256, 2048x768x3072, 2048x3072x768, 2048x256x30522)
// found wide plateaus: kc 192-512 within 5-8% of each other, 256 best or tied on every shape;
// mc 72-480 within 3-5%, 144 and 192 at the top; nc 512-8192 within 3%. The values below sit
// inside the plateaus, where the cache arithmetic puts them.
//
// kc: the B micro-panel (kc x 16 f32 = 16 KiB) fills half of L1 and leaves the rest to the A
// panel streaming past it and to C. The chunking depends on k alone (the summation order
// must not depend on anything else), and both kernels use the same one so they agree bit for
// bit. A k slightly over a multiple of kPackedKc is cut into equal chunks rather than a full
// one and a sliver.
constexpr int64_t kPackedKc = 256;
// mc: the packed A block (mc x kc f32 = 144 KiB with kc = 256) sits in L2 with room for the
// B panels passing through.
constexpr int64_t kAvx2Mc = 144;
// nc: the packed B block (kc x nc f32 = 4 MiB) in L3, shared by the cores of a CCX.
constexpr int64_t kAvx2Nc = 4096;
// AVX-512: the same L2 share for A and L3 share for B, with tile sizes that divide them. Its B
// micro-panel is 32 KiB at kc = 256: all of a 32 KiB L1 on Skylake-X, two thirds of the 48 KiB
// L1 of Ice Lake and Sapphire Rapids. Sweeps on an Intel Xeon with a 48 KiB L1 and a 2 MiB L2
// (family 6 model 207, one thread, fwd/dgrad/wgrad at BERT's shapes): mc 144, 288 and 480 and
// nc 1024 and 4096 within 3% of each other; kc 384 was 2-5% faster on the shapes with k > 256
// and kc 128 or 192 5-15% slower, but kc is shared with the AVX2 kernel so both give the same
// bits.
// Also tried there (1 thread, best of 3-4 interleaved runs against this order), none taken:
// holding several chunks' packed B so that an mc x nc block of C stays in L2 across the chunks
// (nc 1024, 4-16 MiB of B): within the noise. BLIS's roles for a 12 x 32 tile (the A panel
// resident in L1 while B panels stream from L2: ir outside jr, mc 1024, nc 768): 2-6% faster on
// BERT's 768- and 3072-wide products, which oneDNN runs there 8-15% faster still, 2% slower on
// the 256-wide weight gradients the packed GEMM runs. Packing direct panels 16 lanes at a time:
// no faster (a transposed A's packing is bound by its strided reads), 7% slower on the MLM
// decoder's weight gradient. Padding ldc off a multiple of 4 KiB (C rows aliasing in L1): 0-4%.
constexpr int64_t kAvx512Mc = 144;
constexpr int64_t kAvx512Nc = 4096;
// A bf16 C whose k spans several chunks keeps its partial sums in an f32 staging block of
// kStagingBytes per thread: row groups of C as tall as fit for the column block, at most
// kStagedCols wide. B is packed once per row group and A once per column block, so both
// extents stay large enough (1024 or more) for packing to remain a few percent of the work.
constexpr int64_t kStagingBytes = 4 << 20;
constexpr int64_t kStagedCols = 1024;

using InPlaceAMicroKernel = bool (*)(int64_t kc, const float* a, int64_t lda, bool a_transposed, const float* b,
                                     int64_t ldb, float* c, int64_t ldc, float alpha, float beta, int rows);

using BiasMicroKernel = void (*)(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha,
                                 const float* bias);

struct KernelSpec {
  int rows, cols;
  int64_t mc, nc;
  PackedMicroKernel run;
  InPlaceAMicroKernel run_in_place_a;  // null: A is always packed
  BiasMicroKernel run_bias;            // whole tiles of a product with a bias
};

const KernelSpec& kernel_spec(PackedKernel kernel) {
  static const KernelSpec avx2{kPackedAvx2Rows, kPackedAvx2Cols, kAvx2Mc, kAvx2Nc, &packed_micro_kernel_avx2, nullptr,
                               &packed_bias_micro_kernel_avx2};
  static const KernelSpec avx512{kPackedAvx512Rows,           kPackedAvx512Cols,
                                 kAvx512Mc,                   kAvx512Nc,
                                 &packed_micro_kernel_avx512, &in_place_a_micro_kernel_avx512,
                                 &packed_bias_micro_kernel_avx512};
  return kernel == PackedKernel::Avx512 ? avx512 : avx2;
}

constexpr int kMaxTile = std::max(kPackedAvx2Rows * kPackedAvx2Cols, kPackedAvx512Rows * kPackedAvx512Cols);

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// ---- per-thread memory

// Packed panels and the bf16 staging block; grown blocks are zeroed because staging pads are
// read (and ignored) before they are written.
class GrowableBuffer {
 public:
  float* get(int64_t floats) {
    return static_cast<float*>(block_.get(size_t(floats) * sizeof(float), "packed_gemm", /*zero_when_grown=*/true));
  }

 private:
  AlignedBuffer block_;
};

struct ThreadBuffers {
  GrowableBuffer a, b, staging;
};

ThreadBuffers& thread_buffers() {
  thread_local ThreadBuffers buffers;
  return buffers;
}

// ---- loads that widen to f32

inline float widen(float x) { return x; }
inline float widen(BFloat16 x) { return float(x); }

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// The first `count` (1..7) values, zeros after; reads nothing past them.
inline __m256 load_first(const float* p, int count) {
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_maskload_ps(p, mask);
}
inline __m256 load_first(const BFloat16* p, int count) {
  if (count % 2 == 0) {  // whole 32-bit pairs: a masked load reads exactly the count values
    const __m128i mask = _mm_cmpgt_epi32(_mm_set1_epi32(count / 2), _mm_setr_epi32(0, 1, 2, 3));
    const __m128i h = _mm_maskload_epi32(reinterpret_cast<const int*>(p), mask);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  alignas(32) float t[8] = {};
  for (int i = 0; i < count; ++i) t[i] = float(p[i]);
  return _mm256_load_ps(t);
}

inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
// Eight values rounded as BFloat16(float) does: to nearest even, NaN kept quiet.
inline void store8(BFloat16* p, __m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
  const __m256i bits = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

inline void transpose8x8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// ---- packing
//
// A panel holds `width` lanes for kc steps: dst[p * width + r]. Lanes at or past `valid` are
// zero. Stores are whole vectors of 8; where width is not a multiple of 8 a store runs past its
// step into the next one, always before that next step's own stores, so the spill is
// overwritten; the last step's spill lands in the panel's own slack (panel_stride below).

// Floats between the starts of consecutive panels: whole vectors for B panels (kept 64-byte
// aligned for the micro-kernel's aligned loads), plus room for the last step's spill.
int64_t panel_stride(int width, int64_t kc) { return width * kc + (width % 8 != 0 ? 8 : 0); }

// dst[p * width + r] = src[r * ld + p]: each lane is a row of the source, read along p
// (A not transposed, B transposed).
template <class T>
void pack_transposed(const T* src, int64_t ld, int valid, int width, int64_t kc, float* dst) {
  const int groups = (width + 7) / 8;
  const bool ragged = width % 8 != 0;
  int64_t p = 0;
  for (; p + 8 <= kc; p += 8) {
    // The ragged group (whose stores spill) first, then the whole ones, which overwrite the spill.
    for (int gi = 0; gi < groups; ++gi) {
      const int g = ragged ? (gi == 0 ? groups - 1 : gi - 1) : gi;
      __m256 r[8];
      for (int q = 0; q < 8; ++q) {
        const int row = 8 * g + q;
        r[q] = row < valid ? load8(src + row * ld + p) : _mm256_setzero_ps();
      }
      transpose8x8(r);
      for (int q = 0; q < 8; ++q) _mm256_storeu_ps(dst + (p + q) * width + 8 * g, r[q]);
    }
  }
  for (; p < kc; ++p) {
    float* d = dst + p * width;
    for (int r = 0; r < width; ++r) d[r] = r < valid ? widen(src[r * ld + p]) : 0.0f;
  }
}

// dst[p * width + r] = src[p * ld + r] for steps [p0, p1): each step is a row of the source
// (A transposed, B not).
template <class T>
void pack_direct(const T* src, int64_t ld, int valid, int width, int64_t p0, int64_t p1, float* dst) {
  for (int64_t p = p0; p < p1; ++p) {
    const T* s = src + p * ld;
    float* d = dst + p * width;
    for (int r0 = 0; r0 < width; r0 += 8) {
      const int count = valid - r0;
      const __m256 v = count >= 8 ? load8(s + r0) : count > 0 ? load_first(s + r0, count) : _mm256_setzero_ps();
      _mm256_storeu_ps(d + r0, v);
    }
  }
}

// Steps of a direct pack taken together across all panels: each source row is then read in
// runs of a few hundred bytes instead of one panel's 24-128 bytes per row and page.
constexpr int64_t kDirectStepBlock = 16;

// Packs `count` lanes (rows of op(A) or columns of op(B)) starting at lane 0 of src into
// ceil(count / width) panels of kc steps. transposed: lane r is src[r * ld + p]; otherwise
// src[p * ld + r].
template <class T>
void pack_panels(bool transposed, const T* src, int64_t ld, int64_t count, int width, int64_t kc, float* dst) {
  const int64_t stride = panel_stride(width, kc);
  if (transposed) {
    for (int64_t r0 = 0; r0 < count; r0 += width)
      pack_transposed(src + r0 * ld, ld, int(std::min<int64_t>(width, count - r0)), width, kc,
                      dst + r0 / width * stride);
    return;
  }
  for (int64_t p0 = 0; p0 < kc; p0 += kDirectStepBlock) {
    const int64_t p1 = std::min(kc, p0 + kDirectStepBlock);
    for (int64_t r0 = 0; r0 < count; r0 += width)
      pack_direct(src + r0, ld, int(std::min<int64_t>(width, count - r0)), width, p0, p1, dst + r0 / width * stride);
  }
}

// ---- tiles

template <class TC>
void read_tile(const TC* c, int64_t ldc, int rows, int cols, float* t, int64_t ldt) {
  for (int i = 0; i < rows; ++i) {
    int j = 0;
    for (; j + 8 <= cols; j += 8) _mm256_storeu_ps(t + i * ldt + j, load8(c + i * ldc + j));
    for (; j < cols; ++j) t[i * ldt + j] = widen(c[i * ldc + j]);
  }
}

// Asks for the lines of a C tile while the micro-kernel runs on a scratch copy, so that
// write_tile's stores find them in cache (the micro-kernel prefetches only the tile it is given).
template <class TC>
void prefetch_tile(const TC* c, int64_t ldc, int rows, int cols) {
  for (int i = 0; i < rows; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + cols - 1), _MM_HINT_T0);
  }
}

template <class TC>
void write_tile(const float* t, int64_t ldt, int rows, int cols, TC* c, int64_t ldc) {
  for (int i = 0; i < rows; ++i) {
    int j = 0;
    for (; j + 8 <= cols; j += 8) store8(c + i * ldc + j, _mm256_loadu_ps(t + i * ldt + j));
    for (; j < cols; ++j) c[i * ldc + j] = TC(t[i * ldt + j]);
  }
}

// bias (or null): C's first chunk starts from the bias instead of C: whole f32 tiles add it in
// the micro-kernel's epilogue (run_bias), others copy it into the scratch tile (or staging block)
// the micro-kernel then reads back with beta = 1; either way the bits of a C seeded with the bias,
// without reading C (read_tile with a row stride of 0 repeats the row).
template <class TA, class TB, class TC>
void blocked_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const TA* a,
                  int64_t lda, const TB* b, int64_t ldb, float beta, TC* c, int64_t ldc, const KernelSpec& ks,
                  const TC* bias) {
  constexpr bool bf16_out = std::is_same_v<TC, BFloat16>;
  const int mr = ks.rows, nr = ks.cols;
  const int64_t chunks = (k + kPackedKc - 1) / kPackedKc;
  const int64_t chunk = (k + chunks - 1) / chunks;  // the last chunk may be shorter
  const bool staged = bf16_out && chunks > 1;
  const int64_t nc_max = staged ? std::min(ks.nc, kStagedCols) : ks.nc;
  const int64_t nc_cap = round_up(std::min(n, nc_max), nr);
  int64_t group_rows = m;
  if (staged) {  // equal groups, each within the staging block
    const int64_t fit = std::max<int64_t>(mr, kStagingBytes / int64_t(sizeof(float)) / nc_cap / mr * mr);
    const int64_t groups = (m + fit - 1) / fit;
    group_rows = round_up((m + groups - 1) / groups, mr);
  }

  // A narrow f32 product reads A in place (a last row panel of a height the in-place tile lacks
  // is packed), and B too when it is not transposed and every column panel is whole.
  bool in_place_a = false, in_place_b = false;
  if constexpr (std::is_same_v<TA, float> && std::is_same_v<TB, float> && !bf16_out) {
    in_place_a = ks.run_in_place_a != nullptr && n <= kInPlaceMaxN;
    // (B in place only where every row panel reads A in place: the packed tile wants a packed B.)
    in_place_b = in_place_a && !trans_b && n % nr == 0 && in_place_a_rows_supported(int(m % mr == 0 ? mr : m % mr));
  }

  ThreadBuffers& buffers = thread_buffers();
  float* packed_b = buffers.b.get(nc_cap / nr * panel_stride(nr, chunk));
  float* packed_a = buffers.a.get(round_up(std::min(m, ks.mc), mr) / mr * panel_stride(mr, chunk));
  float* staging = staged ? buffers.staging.get(round_up(std::min(m, group_rows), mr) * nc_cap) : nullptr;
  alignas(64) float tile[kMaxTile];

  for (int64_t jc = 0; jc < n; jc += nc_max) {
    const int64_t nc = std::min(nc_max, n - jc);
    const int64_t lds = round_up(nc, nr);  // staging row stride
    for (int64_t g = 0; g < m; g += group_rows) {
      const int64_t mg = std::min(group_rows, m - g);
      for (int64_t q = 0; q < chunks; ++q) {
        const int64_t pc = q * chunk, kc = std::min(chunk, k - pc);
        const bool first = q == 0, last = q == chunks - 1;
        const int64_t b_stride = panel_stride(nr, kc), a_stride = panel_stride(mr, kc);
        if (!in_place_b) pack_panels(trans_b, trans_b ? b + jc * ldb + pc : b + pc * ldb + jc, ldb, nc, nr, kc, packed_b);
        for (int64_t ic = g; ic < g + mg; ic += ks.mc) {
          const int64_t mc = std::min(ks.mc, g + mg - ic);
          const int64_t ragged = mc % mr;
          const int64_t packed_from =  // rows before it are read in place
              !in_place_a ? 0 : ragged == 0 || in_place_a_rows_supported(int(ragged)) ? mc : mc - ragged;
          if (packed_from < mc) {
            if (trans_a)
              pack_panels(false, a + pc * lda + ic + packed_from, lda, mc - packed_from, mr, kc, packed_a);
            else
              pack_panels(true, a + (ic + packed_from) * lda + pc, lda, mc - packed_from, mr, kc, packed_a);
          }
          for (int64_t jr = 0; jr < nc; jr += nr) {
            const float* b_panel = packed_b + jr / nr * b_stride;
            if constexpr (std::is_same_v<TB, float>) {
              if (in_place_b) b_panel = b + pc * ldb + jc + jr;
            }
            const int cols = int(std::min<int64_t>(nr, nc - jr));
            for (int64_t ir = 0; ir < mc; ir += mr) {
              const float* a_panel = ir >= packed_from ? packed_a + (ir - packed_from) / mr * a_stride : nullptr;
              const int rows = int(std::min<int64_t>(mr, mc - ir));
              // The tile into dst (row stride ld), A from its panel or in place.
              auto run_tile = [&](float* dst, int64_t ld, float beta_q) {
                if constexpr (std::is_same_v<TA, float>) {
                  if (ir < packed_from) {
                    const int64_t row = ic + ir;
                    const bool ran = ks.run_in_place_a(kc, trans_a ? a + pc * lda + row : a + row * lda + pc, lda,
                                                       trans_a, b_panel, in_place_b ? ldb : 0, dst, ld, alpha, beta_q,
                                                       rows);
                    EMBER_CHECK(ran, "packed_gemm: no in-place tile of ", rows, " rows");
                    return;
                  }
                }
                ks.run(kc, a_panel, b_panel, dst, ld, alpha, beta_q);
              };
              TC* ct = c + (ic + ir) * ldc + jc + jr;
              const TC* bias_t = bias ? bias + jc + jr : nullptr;
              const bool seed = first && bias_t != nullptr;  // start from the bias instead of C
              const float beta_first = bias_t ? 1.0f : beta;
              if constexpr (!bf16_out) {
                const float beta_q = first ? beta_first : 1.0f;
                if ((rows == mr || ir < packed_from) && cols == nr && !seed) {
                  run_tile(ct, ldc, beta_q);
                } else if (seed && rows == mr && cols == nr && ir >= packed_from) {
                  if constexpr (std::is_same_v<TC, float>) ks.run_bias(kc, a_panel, b_panel, ct, ldc, alpha, bias_t);
                } else {
                  // Edge tiles, and tiles that start from the bias (C unread): formed in L1,
                  // then written to C once.
                  if (beta_q != 0.0f) {
                    if (rows != mr || cols != nr) std::fill(tile, tile + mr * nr, 0.0f);
                    if (seed) read_tile(bias_t, 0, rows, cols, tile, nr);
                    else read_tile(ct, ldc, rows, cols, tile, nr);
                  }
                  prefetch_tile(ct, ldc, rows, cols);
                  run_tile(tile, nr, beta_q);
                  write_tile(tile, nr, rows, cols, ct, ldc);
                }
              } else if (!staged) {
                if (beta_first != 0.0f) {
                  if (rows != mr || cols != nr) std::fill(tile, tile + mr * nr, 0.0f);
                  if (seed) read_tile(bias_t, 0, rows, cols, tile, nr);
                  else read_tile(ct, ldc, rows, cols, tile, nr);
                }
                if (seed) prefetch_tile(ct, ldc, rows, cols);  // C was not read: fetch it for the stores
                ks.run(kc, a_panel, b_panel, tile, nr, alpha, beta_first);
                write_tile(tile, nr, rows, cols, ct, ldc);
              } else {
                float* st = staging + (ic - g + ir) * lds + jr;
                if (seed) read_tile(bias_t, 0, rows, cols, st, lds);
                else if (first && beta != 0.0f) read_tile(ct, ldc, rows, cols, st, lds);
                ks.run(kc, a_panel, b_panel, st, lds, alpha, first ? beta_first : 1.0f);
                if (last) write_tile(st, lds, rows, cols, ct, ldc);
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace

const char* packed_kernel_name(PackedKernel kernel) {
  switch (kernel) {
    case PackedKernel::Avx2: return "avx2";
    case PackedKernel::Avx512: return "avx512";
  }
  return "unknown";
}

bool packed_kernel_available(PackedKernel kernel) {
  switch (kernel) {
    case PackedKernel::Avx2: return cpu_features().avx2 && cpu_features().fma;
    case PackedKernel::Avx512: return cpu_capability() == CpuCapability::Avx512 && cpu_features().avx512f;
  }
  return false;
}

PackedKernel packed_kernel_for_this_cpu() {
  return packed_kernel_available(PackedKernel::Avx512) ? PackedKernel::Avx512 : PackedKernel::Avx2;
}

template <class TA, class TB, class TC>
void packed_gemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const TA* a,
                        int64_t lda, const TB* b, int64_t ldb, float beta, TC* c, int64_t ldc, PackedKernel kernel,
                        const TC* bias) {
  if (m <= 0 || n <= 0) return;
  EMBER_CHECK(packed_kernel_available(kernel), "packed_gemm: this CPU at capability ",
              cpu_capability_name(cpu_capability()), " cannot run the ", packed_kernel_name(kernel), " kernel");
  EMBER_CHECK(bias == nullptr || beta == 0.0f, "packed_gemm: a bias takes the place of beta * C, so beta must be 0, ",
              "got ", beta, " for m=", m, " n=", n, " k=", k);
  if (k <= 0 || alpha == 0.0f) {
    scale_by_beta(m, n, beta, c, ldc);
    if (bias) seed_rows_with_bias(m, n, bias, c, ldc);
    return;
  }
  blocked_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, kernel_spec(kernel), bias);
}

template <class TA, class TB, class TC>
void packed_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const TA* a, int64_t lda,
                 const TB* b, int64_t ldb, float beta, TC* c, int64_t ldc, PackedKernel kernel, const TC* bias) {
  if (m <= 0 || n <= 0) return;
  gemm_in_bands(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc,
                [&](int64_t mb, int64_t nb, const TA* ab, const TB* bb, TC* cb) {
                  // A band of columns starts (cb - c) columns in; a band of rows at column 0.
                  const TC* bias_b = bias ? bias + (cb - c) % ldc : nullptr;
                  packed_gemm_serial(trans_a, trans_b, mb, nb, k, alpha, ab, lda, bb, ldb, beta, cb, ldc, kernel,
                                     bias_b);
                });
}

#define EMBER_PACKED_GEMM_INSTANTIATE(TA, TB, TC)                                                                  \
  template void packed_gemm_serial<TA, TB, TC>(bool, bool, int64_t, int64_t, int64_t, float, const TA*, int64_t,    \
                                               const TB*, int64_t, float, TC*, int64_t, PackedKernel, const TC*);  \
  template void packed_gemm<TA, TB, TC>(bool, bool, int64_t, int64_t, int64_t, float, const TA*, int64_t,           \
                                        const TB*, int64_t, float, TC*, int64_t, PackedKernel, const TC*);
EMBER_PACKED_GEMM_INSTANTIATE(float, float, float)
EMBER_PACKED_GEMM_INSTANTIATE(BFloat16, BFloat16, BFloat16)
EMBER_PACKED_GEMM_INSTANTIATE(BFloat16, BFloat16, float)
#undef EMBER_PACKED_GEMM_INSTANTIATE

}  // namespace ember::cpu
