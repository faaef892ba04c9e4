// Bit-level comparisons for kernels that promise the same bits however their work is grouped
// (rows in pairs or alone, any thread count).
#pragma once
#include <gtest/gtest.h>

#include <functional>

#include "core/tensor.h"

namespace ember::testing {

// The same shape and the same value bits element by element (compared as f64, which every float
// dtype converts to exactly); a NaN matches any NaN, whatever its sign bit.
::testing::AssertionResult same_bits(const Tensor& actual, const Tensor& expected);

// The same dtype, shape and bytes element by element, on any device: stricter than same_bits
// (0 and -0 differ, so do NaN payloads), for kernels that promise an identical byte stream.
::testing::AssertionResult same_bytes(const Tensor& actual, const Tensor& expected);

// For kernels that take rows in pairs: fn(x) for x of 9 rows (an odd count) in f32 and bf16, of
// lengths that reach every lane body and tail, values in [-30, 30], row 3 holding a NaN.
void for_each_odd_row_count_case(const std::function<void(const Tensor& x)>& fn);

// The row norm ops with a weight and bias over the last dim of x [rows, len], whose kernels may
// take rows in pairs forward or backward: forward(x.narrow(0, first_row, n), first_row, weight,
// bias) on all of x and on each row alone must give each row the same y and dx bits, and dweight
// and dbias of all rows at once must equal those of the single rows accumulated in row order (the
// kernels must add the rows' terms in turn whatever the grouping). The output gradient holds
// powers of two, so each product in those sums is exact whether or not the compiler fuses it into
// its add, while a change in the order of the adds still shows.
using RowNormForward = std::function<Tensor(const Tensor& x, int64_t first_row, const Tensor& w, const Tensor& b)>;
void expect_rows_alone_as_among_others(const Tensor& x, const RowNormForward& forward);

}  // namespace ember::testing
