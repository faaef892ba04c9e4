// bf16 GEMM (see gemm.h): C = alpha * op(A) * op(B) + beta * C with bfloat16 A and B, products
// accumulated in f32, C in bf16 or f32.
//
// Native path (CPUs with AMX): oneDNN's matmul primitive with bf16 source and weights, run
// band by band on Ember's pool threads like the f32 GEMM. A primitive is specialised to one shape, layout and
// alpha/beta, and creating one costs far more than running a small product, so primitives live
// in a small LRU cache shared by every thread. oneDNN threads with OpenMP; Ember already splits
// the work, so each call runs with OpenMP capped at one thread on the calling thread.
//
// Widened path: the operands are converted to f32 and multiplied by the f32 GEMM. It serves
// CPUs without AMX (where it is as fast or faster, see native_bf16_enabled),
// EMBER_CPU_CAPABILITY=avx2, products too small to repay a primitive, and cases for which
// oneDNN offers only its reference kernel.
#include <dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_bands.h"

namespace ember::cpu {
namespace {

// Below this many multiply-adds the widened path is faster: running a cached primitive costs
// about 2.5 us (measured: 32^3 takes 2.5 us native against 1.6 us widened, 48^3 3.2 against
// 3.4), and creating one for a shape seen once costs far more.
constexpr double kMinPrimitiveWork = 40.0 * 40.0 * 40.0;
// Distinct (shape, layout, alpha, beta) combinations kept; a model uses a few dozen.
constexpr size_t kCacheCapacity = 256;

// ---- widened path

// Rows per parallel chunk of a conversion: about 16K elements.
int64_t conversion_grain(int64_t cols) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)); }

// A dense f32 copy of a rows x cols bf16 matrix stored with row stride ld.
std::vector<float> widen(const BFloat16* x, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> out(size_t(rows * cols));
  parallel_for(0, rows, conversion_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const BFloat16* src = x + r * ld;
      float* dst = out.data() + r * cols;
      for (int64_t j = 0; j < cols; ++j) dst[j] = float(src[j]);
    }
  });
  return out;
}

template <typename Out>
void widened_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const BFloat16* a,
                  int64_t lda, const BFloat16* b, int64_t ldb, float beta, Out* c, int64_t ldc) {
  // Stored shapes: op(A) = A^T reads a k x m matrix, op(B) = B^T an n x k one.
  const int64_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
  const std::vector<float> a32 = widen(a, trans_a ? k : m, a_cols, lda);
  const std::vector<float> b32 = widen(b, trans_b ? n : k, b_cols, ldb);
  if constexpr (std::is_same_v<Out, float>) {
    gemm<float>(trans_a, trans_b, m, n, k, alpha, a32.data(), a_cols, b32.data(), b_cols, beta, c, ldc);
  } else {
    // Accumulate in f32, round into C once.
    std::vector<float> c32 = beta != 0.0f ? widen(c, m, n, ldc) : std::vector<float>(size_t(m * n));
    gemm<float>(trans_a, trans_b, m, n, k, alpha, a32.data(), a_cols, b32.data(), b_cols, beta, c32.data(), n);
    parallel_for(0, m, conversion_grain(n), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = BFloat16(c32[size_t(i * n + j)]);
    });
  }
}

// C = beta * C, the whole product when k == 0 or alpha == 0. beta == 0 writes zeros without
// reading C (it may hold NaN garbage).
template <typename Out>
void scale_output(int64_t m, int64_t n, float beta, Out* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      Out& v = c[i * ldc + j];
      v = Out(beta == 0.0f ? 0.0f : beta * float(v));
    }
}

// ---- native path

// Caps OpenMP at one thread on this thread for the lifetime of the guard (oneDNN sizes its
// work split at primitive creation and runs it at execution; both must see one thread).
class SingleOmpThread {
 public:
  SingleOmpThread() : previous_(omp_get_max_threads()) {
    if (previous_ != 1) omp_set_num_threads(1);
  }
  ~SingleOmpThread() {
    if (previous_ != 1) omp_set_num_threads(previous_);
  }
  SingleOmpThread(const SingleOmpThread&) = delete;
  SingleOmpThread& operator=(const SingleOmpThread&) = delete;

 private:
  int previous_;
};

// One CPU engine for the process (primitives run only on streams of the engine that created
// them). Never destroyed: pool threads may still hold streams on it at exit.
const dnnl::engine& cpu_engine() {
  static const dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

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
  SingleOmpThread one_thread;
  made.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst), attr, cpu_engine(),
                                         /*allow_empty=*/true);
  if (!made.pd) return made;
  if (std::string_view(made.pd.impl_info_str()).starts_with("ref")) return made;
  made.primitive = dnnl::matmul(made.pd);
  made.scratchpad_bytes = made.pd.scratchpad_desc().get_size();
  made.usable = true;
  return made;
}

class PrimitiveCache {
 public:
  std::shared_ptr<const CachedPrimitive> get(const PrimitiveKey& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = index_.find(key); it != index_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return it->second->second;
    }
    // Created under the lock: bands of one product share a key, and the second band waits
    // for the first band's primitive instead of building its own.
    auto made = std::make_shared<const CachedPrimitive>(create_primitive(key));
    order_.emplace_front(key, made);
    index_[key] = order_.begin();
    if (order_.size() > kCacheCapacity) {
      index_.erase(order_.back().first);
      order_.pop_back();  // a thread running it still holds its own reference
    }
    return made;
  }

 private:
  using Entry = std::pair<PrimitiveKey, std::shared_ptr<const CachedPrimitive>>;
  std::mutex mutex_;
  std::list<Entry> order_;  // most recently used first
  std::unordered_map<PrimitiveKey, std::list<Entry>::iterator, PrimitiveKeyHash> index_;
};

PrimitiveCache& primitive_cache() {
  static PrimitiveCache* cache = new PrimitiveCache();  // outlives pool threads at exit
  return *cache;
}

// Per-thread scratch memory for primitives, grown as needed, 64-byte aligned.
void* thread_scratchpad(size_t bytes) {
  struct Buffer {
    void* data = nullptr;
    size_t size = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer buffer;
  if (buffer.size < bytes) {
    std::free(buffer.data);
    buffer.size = (bytes + 63) / 64 * 64;
    buffer.data = std::aligned_alloc(64, buffer.size);
    EMBER_CHECK(buffer.data != nullptr, "gemm: cannot allocate ", buffer.size, " bytes of bf16 GEMM scratch memory");
  }
  return buffer.data;
}

void run_primitive(const CachedPrimitive& p, const BFloat16* a, const BFloat16* b, void* c) {
  thread_local std::optional<dnnl::stream> stream;
  if (!stream) stream.emplace(cpu_engine());
  const dnnl::engine& engine = cpu_engine();
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, dnnl::memory(p.pd.src_desc(), engine, const_cast<BFloat16*>(a))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(p.pd.weights_desc(), engine, const_cast<BFloat16*>(b))},
      {DNNL_ARG_DST, dnnl::memory(p.pd.dst_desc(), engine, c)}};
  if (p.scratchpad_bytes > 0)
    args.emplace(DNNL_ARG_SCRATCHPAD,
                 dnnl::memory(p.pd.scratchpad_desc(), engine, thread_scratchpad(p.scratchpad_bytes)));
  SingleOmpThread one_thread;
  p.primitive.execute(*stream, args);
  stream->wait();
}

// oneDNN 2.6.3's AMX bf16 matmul dies with SIGILL (a tile shape its kernel did not configure)
// for some odd inner dimensions: k = 63 with m % 64 in [1, 16] and m > 64, and k % 32 == 31
// past about 2300 (found by scanning a few thousand shapes in child processes; no even k
// failed). Odd k, rare in models, takes the widened path.
bool native_kernel_safe(int64_t k) { return k % 2 == 0; }

// Whether to use oneDNN's bf16 matmul: only with AVX-512 allowed and AMX present. Measured with
// oneDNN 2.6 on one core at 1024^3 (DNNL_MAX_CPU_ISA capping the kernels): AMX 500-630 GFLOP/s;
// AVX512-BF16 without AMX 83-88 and plain AVX-512 (bf16 emulated) 27, against 100-108 for the
// f32 GEMM the widened path uses. At AVX2 oneDNN has no bf16 matmul at all.
bool native_bf16_enabled() {
  return cpu_capability() == CpuCapability::Avx512 && cpu_features().amx_bf16;
}

// One band, on the calling thread.
template <typename Out>
void gemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const BFloat16* a,
                 int64_t lda, const BFloat16* b, int64_t ldb, float beta, Out* c, int64_t ldc) {
  const PrimitiveKey key{m,       n,       k,
                         lda,     ldb,     ldc,
                         trans_a, trans_b, std::is_same_v<Out, float>,
                         std::bit_cast<uint32_t>(alpha), std::bit_cast<uint32_t>(beta)};
  std::shared_ptr<const CachedPrimitive> p;
  try {
    p = primitive_cache().get(key);
  } catch (const dnnl::error& e) {
    EMBER_FAIL("gemm: oneDNN could not create a bf16 matmul for m=", m, " n=", n, " k=", k, " lda=", lda,
               " ldb=", ldb, " ldc=", ldc, ": ", e.what());
  }
  if (!p->usable) {
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

template <typename Out>
void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const BFloat16* a,
               int64_t lda, const BFloat16* b, int64_t ldb, float beta, Out* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) {
    scale_output(m, n, beta, c, ldc);
    return;
  }
  const double work = double(m) * double(n) * double(k);
  if (work < kMinPrimitiveWork || !native_kernel_safe(k) || !native_bf16_enabled()) {
    widened_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  gemm_in_bands(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc,
                [&](int64_t mb, int64_t nb, const BFloat16* ab, const BFloat16* bb, Out* cb) {
                  gemm_serial(trans_a, trans_b, mb, nb, k, alpha, ab, lda, bb, ldb, beta, cb, ldc);
                });
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const BFloat16* a, int64_t lda,
          const BFloat16* b, int64_t ldb, float beta, BFloat16* c, int64_t ldc) {
  gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const BFloat16* a, int64_t lda,
          const BFloat16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace ember::cpu
