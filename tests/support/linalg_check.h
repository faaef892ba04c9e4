// Checks for matrix products (matmul, bmm, linear) against the double reference, shared by
// tests/ops/test_linalg.cpp and tests/cuda/test_cuda_matmul.cpp.
//
// Entry (i, j) of a product is a k-term dot product; its rounding error is bounded by a
// multiple of u * sum_p |a_ip| |b_pj|, the multiple growing like sqrt(k). So each entry may be
// off by (tol(out dtype) + tol(accumulation dtype) * sqrt(k)) * (|A| |B|)_ij, the accumulation
// dtype being f32 for f16/bf16; with TF32 on, f32 inputs are rounded to 10-bit mantissas,
// which adds up to 2 * 2^-11 of (|A| |B|)_ij.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>

#include "ember/ember.h"
#include "kernels/reference/ref_tensor.h"

namespace ember::testing {

// r with every value replaced by its magnitude (for the scale |A| |B|).
reference::RefTensor ref_abs(reference::RefTensor r);

// The relative bound above for a k-term product in `dtype`.
double product_rel(DType dtype, int64_t k, bool tf32 = false);

// Every element of got within rel * scale of want (plus one subnormal step of dtype: a result
// that rounds into the subnormal range has that much absolute error), with got's shape and
// dtype as expected.
::testing::AssertionResult product_close(const Tensor& got, const reference::RefTensor& want,
                                         const reference::RefTensor& scale, DType dtype, int64_t k,
                                         bool tf32 = false);

// How an operand sits in memory. A kernel can read the first five in place (Misaligned starts
// one element past an aligned address) and must copy Strided; the last two make batch dims
// that cannot be folded into the GEMM's rows.
enum class Layout { Contiguous, Transposed, Padded, TransposedPadded, Misaligned, Strided, BatchPermuted, BatchExpanded };

const char* layout_name(Layout l);

// A random tensor of logical `shape` laid out as `layout` on `device`; the views are taken on
// the device (copying to a device makes a tensor contiguous). Falls back to contiguous where
// the layout needs more dims than the shape has.
Tensor layout_operand(const Shape& shape, DType dtype, Layout layout, Device device);

// Random operand shapes for a rank-ra @ rank-rb matmul whose batch dims broadcast together;
// matrix sizes in [1 (0 with allow_zero), max_mat], batch sizes in [1 (0), 3].
std::pair<Shape, Shape> matmul_shapes(int ra, int rb, int64_t max_mat, bool allow_zero = false);

}  // namespace ember::testing
