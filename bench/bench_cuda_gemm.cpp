// Ember's CUDA matmul (native::matmul -> cuBLASLt) against plain cuBLAS called directly
// (cublasGemmEx / cublasGemmStridedBatchedEx, CUBLAS_GEMM_DEFAULT) with the same operand
// layouts, on BERT-base shapes: 8192 tokens (64 x 128), hidden 768, FFN 3072, 12 heads.
//
//   fwd  x [T, in] @ W[out, in]^T      (W^T read in place, column-major)
//   dX   dY [T, out] @ W [out, in]
//   dW   dY[T, out]^T @ x [T, in]      (dY^T read in place, column-major)
//   QK^T [768, 128, 64] @ K^T           (K [768, 128, 64], transposed view)
//   PV   [768, 128, 128] @ [768, 128, 64]
//
// dtypes bf16, f16 (f32 accumulation), f32, and f32 with TF32 tensor cores. Each product runs
// a few times to warm up, then `kReps` times, each timed with CUDA events on the default
// stream; the table gives the median as TFLOP/s (2 * batch * n * k * m flops), the ratio
// Ember / cuBLAS, and the largest difference between the two results as a sanity check.
// Ember's time includes allocating its output from the caching allocator, as any caller's does.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/device_api.h"
#include "core/factory.h"
#include "core/native/linalg.h"
#include "kernels/cuda/cublas_handles.h"
#include "tracking/progress.h"

using namespace ember;

namespace {

constexpr int kWarmup = 5;
constexpr int kReps = 25;

// out [batch, n, m] = a [batch, n, k] @ b [batch, k, m]; a_t / b_t: the operand is a
// transposed view of a row-major [.., k, n] / [.., m, k] buffer.
struct Case {
  std::string name;
  int64_t batch, n, k, m;
  bool a_t, b_t;
};

std::vector<Case> cases() {
  const int64_t t = 8192, h = 768, f = 3072;
  std::vector<Case> c;
  const int64_t linears[3][2] = {{h, h}, {h, f}, {f, h}};  // {in, out}
  for (const auto& io : linears) {
    const int64_t in = io[0], out = io[1];
    const std::string tag = std::to_string(in) + "->" + std::to_string(out);
    c.push_back({"fwd " + tag, 1, t, in, out, false, true});
    c.push_back({"dX  " + tag, 1, t, out, in, false, false});
    c.push_back({"dW  " + tag, 1, out, t, in, true, false});
  }
  c.push_back({"attn QK^T", 768, 128, 64, 128, false, true});
  c.push_back({"attn PV", 768, 128, 128, 64, false, false});
  return c;
}

struct Precision {
  const char* name;
  DType dtype;
  bool tf32;
};

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s failed: %s\n", what, cublasGetStatusString(status));
    std::exit(1);
  }
}

// Median milliseconds of fn over kReps timed runs after kWarmup untimed ones.
template <typename F>
double median_ms(F&& fn) {
  for (int i = 0; i < kWarmup; ++i) fn();
  check(cudaDeviceSynchronize(), "warm-up");
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> ms;
  for (int i = 0; i < kReps; ++i) {
    check(cudaEventRecord(start, nullptr), "cudaEventRecord");
    fn();
    check(cudaEventRecord(stop, nullptr), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float t = 0;
    check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    ms.push_back(double(t));
  }
  check(cudaEventDestroy(start), "cudaEventDestroy");
  check(cudaEventDestroy(stop), "cudaEventDestroy");
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// A [batch, rows, cols] GPU operand (2-D when batch is 1), optionally a transposed view of a
// [batch, cols, rows] buffer.
Tensor operand(int64_t batch, int64_t rows, int64_t cols, bool transposed, DType dtype) {
  Shape stored = transposed ? Shape{cols, rows} : Shape{rows, cols};
  if (batch > 1) stored.insert(stored.begin(), batch);
  const Tensor t = randn(stored).to(dtype).to(Device::cuda(0));
  return transposed ? t.transpose(-1, -2) : t;
}

double max_abs_diff(const Tensor& x, const Tensor& y) {
  const std::vector<float> a = x.to_vector<float>(), b = y.to_vector<float>();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
  return worst;
}

}  // namespace

int main() {
  if (!cuda_is_available()) {
    std::printf("no CUDA device: skipped\n");
    return 0;
  }
  cublasHandle_t handle = nullptr;
  check(cublasCreate(&handle), "cublasCreate");
  check(cublasSetStream(handle, nullptr), "cublasSetStream");

  const Precision precisions[] = {
      {"bf16", DType::bf16, false}, {"f16", DType::f16, false}, {"f32", DType::f32, false}, {"tf32", DType::f32, true}};
  std::printf("%-16s %-5s %-22s %11s %11s %7s %11s\n", "shape", "dtype", "b x n x k x m", "Ember TF/s",
              "cuBLAS TF/s", "ratio", "max|diff|");
  const std::vector<Case> all_cases = cases();
  ProgressBar bar("bench_cuda_gemm", int64_t(std::size(precisions) * all_cases.size()), "case");
  int64_t done = 0;
  for (const Precision& p : precisions) {
    cuda::set_allow_tf32(p.tf32);
    for (const Case& c : all_cases) {
      const Tensor a = operand(c.batch, c.n, c.k, c.a_t, p.dtype);
      const Tensor b = operand(c.batch, c.k, c.m, c.b_t, p.dtype);
      Tensor ember_out;
      const double ember_ms = median_ms([&] { ember_out = native::matmul(a, b); });

      // Column-major: C^T [m, n] = B^T A^T. A row-major [k, m] b is the column-major m x k
      // matrix B^T (no transpose); a transposed view of a row-major [m, k] buffer is the
      // column-major k x m matrix B (transpose). Likewise for a.
      Tensor cublas_out = empty(ember_out.shape(), {p.dtype, Device::cuda(0)});
      const cublasOperation_t op_b = c.b_t ? CUBLAS_OP_T : CUBLAS_OP_N;
      const cublasOperation_t op_a = c.a_t ? CUBLAS_OP_T : CUBLAS_OP_N;
      const int ldb = int(c.b_t ? c.k : c.m), lda = int(c.a_t ? c.n : c.k), ldc = int(c.m);
      const cudaDataType_t type = cuda_type(p.dtype);
      const cublasComputeType_t compute = p.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      const float alpha = 1.0f, beta = 0.0f;
      const double cublas_ms = median_ms([&] {
        if (c.batch == 1) {
          check(cublasGemmEx(handle, op_b, op_a, int(c.m), int(c.n), int(c.k), &alpha, b.raw_data(), type, ldb,
                             a.raw_data(), type, lda, &beta, cublas_out.raw_data(), type, ldc, compute,
                             CUBLAS_GEMM_DEFAULT),
                "cublasGemmEx");
        } else {
          check(cublasGemmStridedBatchedEx(handle, op_b, op_a, int(c.m), int(c.n), int(c.k), &alpha, b.raw_data(),
                                           type, ldb, c.k * c.m, a.raw_data(), type, lda, c.n * c.k, &beta,
                                           cublas_out.raw_data(), type, ldc, c.n * c.m, int(c.batch), compute,
                                           CUBLAS_GEMM_DEFAULT),
                "cublasGemmStridedBatchedEx");
        }
      });

      const double flops = 2.0 * double(c.batch) * double(c.n) * double(c.k) * double(c.m);
      const double ember_tf = flops / (ember_ms * 1e-3) / 1e12, cublas_tf = flops / (cublas_ms * 1e-3) / 1e12;
      const std::string dims = std::to_string(c.batch) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) +
                               "x" + std::to_string(c.m);
      char row[160];
      std::snprintf(row, sizeof row, "%-16s %-5s %-22s %11.1f %11.1f %7.3f %11.3g", c.name.c_str(), p.name,
                    dims.c_str(), ember_tf, cublas_tf, ember_tf / cublas_tf, max_abs_diff(ember_out, cublas_out));
      bar.print(row);
      bar.update(++done, c.name + " " + p.name);
    }
  }
  bar.finish();
  cuda::set_allow_tf32(false);
  check(cublasDestroy(handle), "cublasDestroy");
  return 0;
}
