// Reference matrix products: plain loops in double precision.
#pragma once
#include "kernels/reference/ref_tensor.h"

namespace ember::reference {

// torch.matmul semantics: 1-D @ 1-D is a dot product, 1-D operands are promoted to a row
// (left) or column (right) and the added dim dropped, batch dims broadcast.
RefTensor matmul(const RefTensor& a, const RefTensor& b);
// [B, n, k] @ [B, k, m].
RefTensor bmm(const RefTensor& a, const RefTensor& b);
// x [..., in] @ weight[out, in]^T (+ bias[out] when has_bias).
RefTensor linear(const RefTensor& x, const RefTensor& weight, const RefTensor& bias, bool has_bias);

}  // namespace ember::reference
