// Matrix products without autograd: shape checks, 1-D promotion, batch broadcasting, output
// allocation, then one device kernel (matmul_stub) that every product goes through.
#pragma once
#include <optional>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace ember::native {

// out [B..., n, m] (fresh, contiguous) = a [B..., n, k] @ b [B..., k, m], plus bias [m] added to
// every row when bias is defined. a and b carry out's batch dims (broadcast ones with stride 0),
// and the last two dims of each form a BLAS matrix (see blas_matrix). One dtype throughout.
EMBER_DECLARE_STUB(matmul_stub, void (*)(const Tensor& out, const Tensor& a, const Tensor& b,
                                         const Tensor& bias));

// How a BLAS reads a strided rows x cols matrix: element (i, j) at i * ld + j (row-major) or
// i + j * ld (column-major), with ld >= the contiguous extent as BLAS requires.
struct BlasMatrix {
  bool col_major = false;
  int64_t ld = 1;
};
// The BLAS reading of a matrix with these strides, or nothing when neither stride is unit
// (such an operand has to be copied first).
std::optional<BlasMatrix> blas_matrix(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride);
// The BLAS reading of the last two dims of a matmul_stub operand, which linalg guarantees
// exists; `kernel` names the device kernel in the error raised if it does not.
BlasMatrix operand_matrix(const Tensor& x, const char* kernel);
// True when every batch entry of x is the same matrix (batch dims broadcast or of size 1).
bool shared_across_batch(const Tensor& x);
// For x of shape [B..., n, k]: the BLAS reading of x as one [(B... * n), k] matrix, when its
// batch dims step over whole row blocks (true of any contiguous x), else nothing.
std::optional<BlasMatrix> folded_rows_matrix(const Tensor& x);

// torch.matmul: 1-D @ 1-D is a dot product (0-d result); a 1-D left operand is a row vector and
// a 1-D right operand a column vector, the added dim being removed from the result; batch dims
// (all but the last two) broadcast. Both operands must share one floating dtype and device:
// mixed dtypes are an error, not promoted, so a silent widening never hides a precision bug.
Tensor matmul(const Tensor& a, const Tensor& b);
// [B, n, k] @ [B, k, m] -> [B, n, m], no broadcasting.
Tensor bmm(const Tensor& a, const Tensor& b);
// x [..., in] @ weight[out, in]^T + bias[out] -> [..., out]; bias may be undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

}  // namespace ember::native
