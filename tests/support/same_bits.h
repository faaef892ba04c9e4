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

// For kernels that take rows in pairs: fn(x) for x of 9 rows (an odd count) in f32 and bf16, of
// lengths that reach every lane body and tail, values in [-30, 30], row 3 holding a NaN.
void for_each_odd_row_count_case(const std::function<void(const Tensor& x)>& fn);

}  // namespace ember::testing
