#include "kernels/cpu/gemm.h"

#include <dnnl.h>
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <optional>
#include <string>
#include <type_traits>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/forced_choice.h"
#include "core/parallel.h"
#include "kernels/cpu/gemm_bands.h"
#include "kernels/cpu/gemm_f32_path.h"
#include "kernels/cpu/gemm_packed.h"
#include "kernels/cpu/gemm_profile.h"
#include "kernels/cpu/mkl_sgemm.h"

namespace ember::cpu {
namespace {

// A strided view of caller memory; RowMajor/ColMajor picks which stride is the unit one.
template <typename T, int Order>
using ConstMatrixMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Order>,
                                  Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename T>
using OutMatrixMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>,
                                Eigen::Unaligned, Eigen::OuterStride<>>;


template <typename T, int OrderA, int OrderB>
void product_into(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb,
                  T* c, int64_t ldc) {
  ConstMatrixMap<T, OrderA> A(a, m, k, Eigen::OuterStride<>(lda));
  ConstMatrixMap<T, OrderB> B(b, k, n, Eigen::OuterStride<>(ldb));
  OutMatrixMap<T> C(c, m, n, Eigen::OuterStride<>(ldc));
  // The scalar folds into Eigen's kernel (no temporary); += keeps whatever C was seeded with.
  if (alpha == T(1)) {
    C.noalias() += A * B;
  } else {
    C.noalias() += alpha * A * B;
  }
}

// One single-threaded Eigen GEMM (Eigen is built without its own threading inside Ember).
template <typename T>
void eigen_gemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                 const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  OutMatrixMap<T> C(c, m, n, Eigen::OuterStride<>(ldc));
  if (beta == T(0)) {
    C.setZero();  // not C *= 0: C may hold NaN garbage
  } else if (beta != T(1)) {
    C *= beta;
  }
  if (k == 0 || alpha == T(0)) return;
  constexpr int R = Eigen::RowMajor, Cm = Eigen::ColMajor;
  if (!trans_a && !trans_b) {
    product_into<T, R, R>(m, n, k, alpha, a, lda, b, ldb, c, ldc);
  } else if (!trans_a && trans_b) {
    product_into<T, R, Cm>(m, n, k, alpha, a, lda, b, ldb, c, ldc);
  } else if (trans_a && !trans_b) {
    product_into<T, Cm, R>(m, n, k, alpha, a, lda, b, ldb, c, ldc);
  } else {
    product_into<T, Cm, Cm>(m, n, k, alpha, a, lda, b, ldb, c, ldc);
  }
}

// oneDNN picks its kernels by CPU on first use; EMBER_CPU_CAPABILITY=avx2 caps it like the
// rest of Ember (it can only be set before the first GEMM).
void configure_onednn_once() {
  static const bool done = [] {
    if (cpu_capability() == CpuCapability::Avx2) dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx2);
    return true;
  }();
  (void)done;
}

// One single-threaded oneDNN sgemm (row-major, the same contract as cpu::gemm). oneDNN
// threads with OpenMP; Ember's pool already splits the work, so the call runs with OpenMP
// capped at one thread on this thread, and the caller's setting is restored.
void onednn_sgemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                         int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  configure_onednn_once();
  const int previous = omp_get_max_threads();
  if (previous != 1) omp_set_num_threads(1);
  const dnnl_status_t status =
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (previous != 1) omp_set_num_threads(previous);
  EMBER_CHECK(status == dnnl_success, "gemm: oneDNN sgemm failed with status ", int(status), " for m=", m,
              " n=", n, " k=", k, " lda=", lda, " ldb=", ldb, " ldc=", ldc);
}

// path: chosen once for the whole product (f32_gemm_path_for), so that every band of it runs the
// same kernel and the bits do not depend on the thread count.
void gemm_serial(F32GemmPath path, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (path == F32GemmPath::Packed) {
    packed_gemm_serial(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, packed_kernel_for_this_cpu());
    return;
  }
  if (path == F32GemmPath::Mkl) {
    mkl_sgemm_serial(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if (k == 0) {  // oneDNN rejects k == 0; C = beta * C is all that is left
    eigen_gemm_serial(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  onednn_sgemm_serial(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_serial(F32GemmPath, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                 const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  eigen_gemm_serial(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

// ---- f32 path selection (numbers: the header of gemm_f32_path.h)

namespace {

ForcedChoice<F32GemmPath>& forced_f32_path() {
  static ForcedChoice<F32GemmPath> forced("EMBER_F32_GEMM", {{"onednn", F32GemmPath::OneDnn}, {"packed", F32GemmPath::Packed}, {"mkl", F32GemmPath::Mkl}});
  return forced;
}

}  // namespace

const char* f32_gemm_path_name(F32GemmPath path) {
  switch (path) {
    case F32GemmPath::Packed: return "packed";
    case F32GemmPath::Mkl: return "mkl";
    case F32GemmPath::OneDnn: break;
  }
  return "onednn";
}

void set_f32_gemm_path(std::optional<F32GemmPath> path) {
  forced_f32_path().set(path);
}

F32GemmPath f32_gemm_path_for(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b) {
  if (const auto forced = forced_f32_path().get()) return *forced;
  const bool avx512 = packed_kernel_for_this_cpu() == PackedKernel::Avx512;
  if (double(m) * double(n) * double(k) < kPackedMinWork) {
    const bool in_place = avx512 && !trans_b && n >= kPackedAvx512Cols && n <= kInPlaceMaxN;
    return in_place ? F32GemmPath::Packed : F32GemmPath::OneDnn;
  }
  if (!avx512) return F32GemmPath::Packed;
  // On AVX-512 oneDNN's sgemm leads except on tall narrow products with a transposed A.
  return trans_a && n <= kAvx512PackedMaxN && m >= kAvx512PackedMinM ? F32GemmPath::Packed : F32GemmPath::OneDnn;
}

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const F32GemmPath path =
      std::is_same_v<T, float> ? f32_gemm_path_for(m, n, k, trans_a, trans_b) : F32GemmPath::OneDnn;
  // f32 products only (kernel null: not timed)
  const GemmProfileScope profiled(m, n, k, trans_a, trans_b, /*bias=*/false,
                                  std::is_same_v<T, float> ? f32_gemm_path_name(path) : nullptr);
  gemm_in_bands(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc,
                [&](int64_t mb, int64_t nb, const T* ab, const T* bb, T* cb) {
                  gemm_serial(path, trans_a, trans_b, mb, nb, k, alpha, ab, lda, bb, ldb, beta, cb, ldc);
                });
}

void gemm_bias(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
               const float* b, int64_t ldb, const float* bias, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  // The same bands and path as gemm, so the bits are those of seeding C.
  const F32GemmPath path = f32_gemm_path_for(m, n, k, trans_a, trans_b);
  const GemmProfileScope profiled(m, n, k, trans_a, trans_b, /*bias=*/true, f32_gemm_path_name(path));
  gemm_in_bands(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc,
                [&](int64_t mb, int64_t nb, const float* ab, const float* bb, float* cb) {
                  const float* bias_b = bias + (cb - c) % ldc;  // a column band starts (cb - c) columns in
                  if (path == F32GemmPath::Packed) {
                    packed_gemm_serial(trans_a, trans_b, mb, nb, k, 1.0f, ab, lda, bb, ldb, 0.0f, cb, ldc,
                                       packed_kernel_for_this_cpu(), bias_b);
                    return;
                  }
                  seed_rows_with_bias(mb, nb, bias_b, cb, ldc);
                  gemm_serial(path, trans_a, trans_b, mb, nb, k, 1.0f, ab, lda, bb, ldb, 1.0f, cb, ldc);
                });
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                          int64_t, float, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t);

}  // namespace ember::cpu
