#include "kernels/cpu/gemm.h"

#include <Eigen/Core>

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
void gemm_mapped(int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b, int64_t ldb,
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

}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  OutMatrixMap<T> C(c, m, n, Eigen::OuterStride<>(ldc));
  if (beta == T(0)) {
    C.setZero();  // not C *= 0: C may hold NaN garbage
  } else if (beta != T(1)) {
    C *= beta;
  }
  if (k == 0 || alpha == T(0)) return;
  constexpr int R = Eigen::RowMajor, Cm = Eigen::ColMajor;
  if (!trans_a && !trans_b) {
    gemm_mapped<T, R, R>(m, n, k, alpha, a, lda, b, ldb, c, ldc);
  } else if (!trans_a && trans_b) {
    gemm_mapped<T, R, Cm>(m, n, k, alpha, a, lda, b, ldb, c, ldc);
  } else if (trans_a && !trans_b) {
    gemm_mapped<T, Cm, R>(m, n, k, alpha, a, lda, b, ldb, c, ldc);
  } else {
    gemm_mapped<T, Cm, Cm>(m, n, k, alpha, a, lda, b, ldb, c, ldc);
  }
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                          int64_t, float, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t);

}  // namespace ember::cpu
