// cuBLAS and cuBLASLt state shared by the GEMM paths: one handle per (device, thread), a
// workspace per (device, stream), the TF32 switch, the status check, and lt_matmul (defined in
// linalg_matmul.cu), the one entry point every CUDA matrix product and the GEMM benchmark go through.
//
// Handles are created on first use and kept: a thread that exits hands its handles back to a
// pool for the next thread, since creating one costs far more than a GEMM. The workspace is
// keyed by stream as well as device because two streams running GEMMs at once must not
// share scratch memory.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/error.h"

namespace ember::cuda {

// The cuBLASLt / cuBLAS handle of the calling thread for the current device.
cublasLtHandle_t lt_handle();
cublasHandle_t blas_handle();

// Scratch memory cuBLASLt may use, allocated once per (current device, current stream) from
// the caching allocator and kept for the life of the process.
constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;
void* lt_workspace();

// Whether f32 products may run on TF32 tensor cores (10-bit mantissa inputs, f32
// accumulation). Off by default, like PyTorch's matmul; EMBER_ALLOW_TF32=1 in the
// environment turns it on at startup, set_allow_tf32 at any time (process-wide).
void set_allow_tf32(bool on);
bool allow_tf32();

[[noreturn]] void raise_blas_error(cublasStatus_t status, const char* call, const char* file, int line);

// One column-major product, as BLAS states it:
//   D[i] = op(A[i]) op(B[i]) (+ bias broadcast to every column), i < batch,
// with op(A) m x k, op(B) k x n, D m x n (leading dimension ldd), matrix i of each operand at
// its pointer plus i * stride elements (stride 0: one matrix shared by the whole batch). A, B,
// D and bias share `dtype`; f16 and bf16 accumulate in f32, f32 in f32 (TF32 when allowed),
// f64 in f64. bias, when given, holds m contiguous elements. Runs on the current device and
// stream; all sizes must be positive except k, which may be 0 (D = bias or 0).
struct LtGemm {
  DType dtype = DType::f32;
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 1, stride_a = 0;
  const void* b = nullptr;
  int64_t ldb = 1, stride_b = 0;
  void* d = nullptr;
  int64_t ldd = 1, stride_d = 0;
  int64_t batch = 1;
  const void* bias = nullptr;
};
void lt_matmul(const LtGemm& g);

}  // namespace ember::cuda

// EMBER_CUBLAS_CHECK(cublasLtMatmul(...)) throws ember::Error "cuBLAS error: <message>
// (<name>) in <call> at <file>:<line>" when the call does not return CUBLAS_STATUS_SUCCESS.
#define EMBER_CUBLAS_CHECK(call)                                                   \
  do {                                                                             \
    const cublasStatus_t ember_cublas_status_ = (call);                            \
    if (ember_cublas_status_ != CUBLAS_STATUS_SUCCESS)                             \
      ::ember::cuda::raise_blas_error(ember_cublas_status_, #call, __FILE__, __LINE__); \
  } while (0)
