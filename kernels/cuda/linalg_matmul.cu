// CUDA matmul (native::matmul_stub) on cuBLASLt, and lt_matmul, the column-major GEMM it is
// built on (also called by bench/bench_cuda_gemm.cpp).
//
// Row-major products go to a column-major BLAS through the usual swap: out [n, m] row-major
// is out^T [m, n] column-major, and out^T = b^T a^T, so b is cuBLASLt's A and a its B. An
// operand stored row-major is read untransposed (a row-major [r, c] matrix is a column-major
// [c, r] one) and a column-major one transposed, each with the leading dimension
// native::blas_matrix found, so transposed views are never copied.
//
// Batches, cheapest first: a right operand shared by every batch entry and a left operand
// whose batch dims stack its rows become one GEMM with batch * n rows (a linear layer on
// [B, S, H]); otherwise the batch dims, along which each operand steps by one fixed stride
// (0 for a broadcast), become one strided-batched call; an operand whose batch dims step
// unevenly is made contiguous first.
//
// f16 and bf16 accumulate in f32 and split-K partial sums are kept in the compute type too
// (the reduction scheme is restricted), so the output is rounded once, as on the CPU. A bias
// that starts on a 16-byte boundary goes through the BIAS epilogue; otherwise, or when
// cuBLASLt offers no algorithm with it for a problem, the output is first filled with the bias
// rows and the GEMM accumulates onto it (beta = 1). The algorithm
// cuBLASLt's heuristic picks is cached per problem (shape, layouts, dtype, compute type,
// alignments, device). When the heuristic finds nothing at all, plain cuBLAS runs the product.
#include <algorithm>
#include <climits>
#include <compare>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <optional>

#include "core/native/copy.h"
#include "core/native/linalg.h"
#include "kernels/cuda/cublas_handles.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember {
namespace cuda {
namespace {

constexpr int kFillThreads = 256;
constexpr uint32_t kBiasEpilogueAlignment = 16;  // bytes; see lt_matmul

cudaDataType_t data_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::f64: return CUDA_R_64F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: break;
  }
  EMBER_FAIL("matmul: CUDA matrix products support f32, f64, f16 and bf16, got ", t);
}

cublasComputeType_t compute_type(DType t) {
  if (t == DType::f64) return CUBLAS_COMPUTE_64F;
  if (t == DType::f32 && allow_tf32()) return CUBLAS_COMPUTE_32F_FAST_TF32;
  return CUBLAS_COMPUTE_32F;
}

// Largest power of two, at most 256, dividing every one of the byte counts (addresses too).
uint32_t common_alignment(std::initializer_list<uint64_t> values) {
  uint32_t align = 256;
  for (uint64_t v : values)
    while (align > 1 && v % align != 0) align >>= 1;
  return align;
}

// Fills matrix i of D (column-major m x n, leading dim ldd, matrices stride_d apart) with
// bias[row] in every column, or with zeros when bias is null. One thread per element.
template <typename W>
__global__ void fill_columns_kernel(W* d, const W* bias, int64_t m, int64_t n, int64_t ldd, int64_t stride_d,
                                    int64_t total) {
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx % m;
    const int64_t rest = idx / m;
    const int64_t col = rest % n, mat = rest / n;
    d[mat * stride_d + col * ldd + row] = bias ? bias[row] : W(0);
  }
}

template <typename W>
void launch_fill(const LtGemm& g, cudaStream_t stream) {
  const int64_t total = g.batch * g.n * g.m;
  const int64_t cap = int64_t(multiprocessor_count(current_device())) * 16;
  const int blocks = int(std::max<int64_t>(1, std::min<int64_t>((total + kFillThreads - 1) / kFillThreads, cap)));
  fill_columns_kernel<W><<<blocks, kFillThreads, 0, stream>>>(static_cast<W*>(g.d), static_cast<const W*>(g.bias),
                                                              g.m, g.n, g.ldd, g.stride_d, total);
  EMBER_CUDA_CHECK_LAUNCH();
}

// D = bias rows (or zeros), as the starting value of an accumulating GEMM or the whole answer
// when k == 0. Elements are copied as raw words of the element size.
void fill_columns(const LtGemm& g, cudaStream_t stream) {
  switch (dtype_size(g.dtype)) {
    case 2: launch_fill<uint16_t>(g, stream); return;
    case 4: launch_fill<uint32_t>(g, stream); return;
    case 8: launch_fill<unsigned long long>(g, stream); return;
    default: EMBER_FAIL("matmul: unexpected element size for ", g.dtype);
  }
}

// cuBLASLt descriptors of one problem, destroyed with the object.
struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;

  LtPlan() = default;
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void make_layout(cublasLtMatrixLayout_t* layout, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                 int64_t batch, int64_t stride) {
  EMBER_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(layout, type, uint64_t(rows), uint64_t(cols), ld));
  const int32_t count = int32_t(batch);
  EMBER_CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
  EMBER_CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}

// Descriptors for g; the bias epilogue is attached only when `epilogue` is set.
void build_plan(LtPlan& plan, const LtGemm& g, bool epilogue) {
  const cudaDataType_t type = data_type(g.dtype);
  const cudaDataType_t scale = g.dtype == DType::f64 ? CUDA_R_64F : CUDA_R_32F;
  EMBER_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.op, compute_type(g.dtype), scale));
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  EMBER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  EMBER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (epilogue) {
    const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
    EMBER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
    const void* bias = g.bias;
    EMBER_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  // Stored shapes: op(A) is m x k, so A is k x m when transposed; likewise B.
  make_layout(&plan.a, type, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda, g.batch, g.stride_a);
  make_layout(&plan.b, type, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb, g.batch, g.stride_b);
  make_layout(&plan.d, type, g.m, g.n, g.ldd, g.batch, g.stride_d);
}

struct AlgoKey {
  int device, dtype, compute;
  bool trans_a, trans_b, bias;
  int64_t m, n, k, lda, ldb, ldd, stride_a, stride_b, stride_d, batch;
  uint32_t align_a, align_b, align_d, align_bias;
  auto operator<=>(const AlgoKey&) const = default;
};

struct AlgoChoice {
  bool found = false;
  bool epilogue = false;  // the algorithm applies the bias itself
  cublasLtMatmulAlgo_t algo{};
};

// The best algorithm the heuristic offers for `plan`, if any fits the workspace.
std::optional<cublasLtMatmulAlgo_t> heuristic(const LtPlan& plan, const AlgoKey& key) {
  cublasLtMatmulPreference_t pref = nullptr;
  EMBER_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
  } guard{pref};
  const uint64_t workspace = kLtWorkspaceBytes;
  EMBER_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                          sizeof(workspace)));
  const uint32_t aligns[3] = {key.align_a, key.align_b, key.align_d};
  EMBER_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                          &aligns[0], sizeof(uint32_t)));
  EMBER_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                          &aligns[1], sizeof(uint32_t)));
  EMBER_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                          &aligns[2], sizeof(uint32_t)));
  EMBER_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                          &aligns[2], sizeof(uint32_t)));
  // Split-K partial sums only in the compute type, reduced in a separate pass: reducing them
  // in a 16-bit output type would round more than once, and the in-place scheme reduces
  // through the output buffer. Algorithms without split-K are always allowed.
  const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  EMBER_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask)));
  constexpr int kRequested = 4;
  cublasLtMatmulHeuristicResult_t results[kRequested] = {};
  int returned = 0;
  // Any failure here (NOT_SUPPORTED for a configuration without algorithms, or a layout this
  // cuBLASLt refuses) means "no algorithm": the caller falls back, and plain cuBLAS reports
  // a problem that is really invalid.
  if (cublasLtMatmulAlgoGetHeuristic(lt_handle(), plan.op, plan.a, plan.b, plan.d, plan.d, pref, kRequested, results,
                                     &returned) != CUBLAS_STATUS_SUCCESS)
    return std::nullopt;
  for (int i = 0; i < std::min(returned, kRequested); ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= kLtWorkspaceBytes)
      return results[i].algo;
  return std::nullopt;
}

std::mutex algo_mu;
std::map<AlgoKey, AlgoChoice>& algo_cache() {
  static auto* cache = new std::map<AlgoKey, AlgoChoice>;
  return *cache;
}

// Plain cuBLAS, for problems cuBLASLt's heuristic has no algorithm for. D already holds the
// bias rows when `accumulate` is set.
void blas_fallback(const LtGemm& g, bool accumulate, cudaStream_t stream) {
  for (int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldd})
    EMBER_CHECK(v <= INT_MAX, "matmul: GEMM of size ", g.m, " x ", g.n, " x ", g.k,
                " has no cuBLASLt algorithm and is too large for cuBLAS's 32-bit sizes");
  cublasHandle_t h = blas_handle();
  EMBER_CUBLAS_CHECK(cublasSetStream(h, stream));
  const cudaDataType_t type = data_type(g.dtype);
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const double alpha64 = 1.0, beta64 = accumulate ? 1.0 : 0.0;
  const float alpha32 = 1.0f, beta32 = accumulate ? 1.0f : 0.0f;
  const bool f64 = g.dtype == DType::f64;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : static_cast<const void*>(&alpha32);
  const void* beta = f64 ? static_cast<const void*>(&beta64) : static_cast<const void*>(&beta32);
  EMBER_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, ta, tb, int(g.m), int(g.n), int(g.k), alpha, g.a, type, int(g.lda),
                                                g.stride_a, g.b, type, int(g.ldb), g.stride_b, beta, g.d, type,
                                                int(g.ldd), g.stride_d, int(g.batch), compute_type(g.dtype),
                                                CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void lt_matmul(const LtGemm& g) {
  EMBER_CHECK(g.m > 0 && g.n > 0 && g.k >= 0 && g.batch > 0, "lt_matmul: sizes must be positive (k may be 0), got m ",
              g.m, ", n ", g.n, ", k ", g.k, ", batch ", g.batch);
  EMBER_CHECK(g.batch <= INT32_MAX, "lt_matmul: batch count ", g.batch, " exceeds cuBLAS's 32-bit limit");
  EMBER_CHECK(g.ldd >= g.m && (g.batch == 1 || g.stride_d >= g.ldd * g.n), "lt_matmul: output leading dimension ",
              g.ldd, " and batch stride ", g.stride_d, " overlap for m ", g.m, ", n ", g.n);
  (void)data_type(g.dtype);  // rejects other dtypes
  const cudaStream_t stream = current_stream();
  if (g.k == 0) {  // empty sum: D is the bias rows or zeros
    fill_columns(g, stream);
    return;
  }

  const uint64_t es = dtype_size(g.dtype);
  auto align = [&](const void* p, int64_t ld, int64_t stride) {
    return common_alignment({uint64_t(reinterpret_cast<uintptr_t>(p)), uint64_t(ld) * es,
                             g.batch > 1 ? uint64_t(stride) * es : 0});
  };
  const AlgoKey key{current_device(),
                    int(g.dtype),
                    int(compute_type(g.dtype)),
                    g.trans_a,
                    g.trans_b,
                    g.bias != nullptr,
                    g.m,
                    g.n,
                    g.k,
                    g.lda,
                    g.ldb,
                    g.ldd,
                    g.stride_a,
                    g.stride_b,
                    g.stride_d,
                    g.batch,
                    align(g.a, g.lda, g.stride_a),
                    align(g.b, g.ldb, g.stride_b),
                    align(g.d, g.ldd, g.stride_d),
                    g.bias ? common_alignment({uint64_t(reinterpret_cast<uintptr_t>(g.bias))}) : 0u};

  AlgoChoice choice;
  bool cached = false;
  {
    std::lock_guard<std::mutex> lock(algo_mu);
    auto it = algo_cache().find(key);
    if (it != algo_cache().end()) {
      choice = it->second;
      cached = true;
    }
  }
  if (!cached) {
    // The epilogue reads the bias with vector loads: a bias that starts off a 16-byte boundary
    // (a slice at an odd offset) would fault with a misaligned address, which poisons the
    // context. Such a bias is D's starting value instead.
    if (g.bias && key.align_bias >= kBiasEpilogueAlignment) {
      LtPlan with_bias;
      build_plan(with_bias, g, /*epilogue=*/true);
      if (auto algo = heuristic(with_bias, key)) choice = AlgoChoice{true, true, *algo};
    }
    if (!choice.found) {
      LtPlan plain;
      build_plan(plain, g, /*epilogue=*/false);
      if (auto algo = heuristic(plain, key)) choice = AlgoChoice{true, false, *algo};
    }
    std::lock_guard<std::mutex> lock(algo_mu);
    algo_cache().emplace(key, choice);
  }

  // Without the epilogue the bias is D's starting value, accumulated onto with beta = 1.
  const bool accumulate = g.bias != nullptr && !(choice.found && choice.epilogue);
  if (accumulate) fill_columns(g, stream);
  if (!choice.found) {
    blas_fallback(g, accumulate, stream);
    return;
  }
  LtPlan plan;
  build_plan(plan, g, choice.epilogue);
  const double alpha64 = 1.0, beta64 = accumulate ? 1.0 : 0.0;
  const float alpha32 = 1.0f, beta32 = accumulate ? 1.0f : 0.0f;
  const bool f64 = g.dtype == DType::f64;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : static_cast<const void*>(&alpha32);
  const void* beta = f64 ? static_cast<const void*>(&beta64) : static_cast<const void*>(&beta32);
  EMBER_CUBLAS_CHECK(cublasLtMatmul(lt_handle(), plan.op, alpha, g.a, plan.a, g.b, plan.b, beta, g.d, plan.d, g.d,
                                    plan.d, &choice.algo, lt_workspace(), kLtWorkspaceBytes, stream));
}

}  // namespace cuda

namespace {

using native::BlasMatrix;

BlasMatrix matrix_of(const Tensor& x) { return native::operand_matrix(x, "CUDA kernel"); }
using native::shared_across_batch;

// The one stride (in elements, >= 0) by which x steps from each batch entry to the next over
// its batch dims [first, last), read as a single flattened dim; nothing when no single
// stride does.
std::optional<int64_t> uniform_batch_stride(const Tensor& x, int64_t first, int64_t last) {
  int64_t count = 1, stride = 0;
  bool have = false;
  for (int64_t d = last - 1; d >= first; --d) {
    const int64_t size = x.shape()[d], st = x.strides()[d];
    if (size == 1) continue;
    if (!have) {
      if (st < 0) return std::nullopt;
      stride = st;
      have = true;
    } else if (st != count * stride) {
      return std::nullopt;
    }
    count *= size;
  }
  return stride;
}

void matmul_cuda(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  if (out.numel() == 0) return;
  cuda::DeviceGuard guard(out.device(), "matmul");
  const int64_t nd = out.dim();
  const int64_t n = out.shape()[nd - 2], m = out.shape()[nd - 1], k = a.shape()[nd - 1];
  const int64_t batches = out.numel() / (n * m);
  const int64_t es = int64_t(out.element_size());
  const char* pa = static_cast<const char*>(a.raw_data());
  const char* pb = static_cast<const char*>(b.raw_data());
  char* po = static_cast<char*>(out.raw_data());
  const BlasMatrix lb = matrix_of(b);

  // Column-major view: D = out^T (m x rows), A = b^T, B = a^T (see the top of the file).
  cuda::LtGemm g;
  g.dtype = out.dtype();
  g.m = m;
  g.k = k;
  g.trans_a = lb.col_major;
  g.lda = lb.ld;
  g.ldd = m;
  g.bias = bias.defined() ? bias.raw_data() : nullptr;

  if (shared_across_batch(b)) {
    if (auto la = native::folded_rows_matrix(a)) {
      g.n = batches * n;
      g.trans_b = la->col_major;
      g.ldb = la->ld;
      g.a = pb;
      g.b = pa;
      g.d = po;
      cuda::lt_matmul(g);
      return;
    }
  }

  const BlasMatrix la = matrix_of(a);
  g.n = n;
  g.trans_b = la.col_major;
  g.ldb = la.ld;
  g.stride_d = n * m;

  // Batch dims that both operands step through by one fixed stride each (0 for a broadcast)
  // make one strided-batched call. The heads of a packed [B, L, 3E] projection, say, step by D
  // inside a batch and by L * 3E across batches: no single stride. Such an operand is made
  // contiguous first: one memory-bound copy kernel, where a host loop would launch B GEMMs.
  const int64_t nb = nd - 2;
  const std::optional<int64_t> sa = uniform_batch_stride(a, 0, nb), sb = uniform_batch_stride(b, 0, nb);
  if (!sa || !sb) {
    matmul_cuda(out, sa ? a : native::contiguous(a), sb ? b : native::contiguous(b), bias);
    return;
  }
  g.batch = batches;
  g.stride_a = *sb;
  g.stride_b = *sa;
  g.a = pb;
  g.b = pa;
  g.d = po;
  cuda::lt_matmul(g);
}

}  // namespace

EMBER_REGISTER_KERNEL(native::matmul_stub, CUDA, &matmul_cuda);

}  // namespace ember
