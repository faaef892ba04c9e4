// For kernels with an AVX-512 twin of their AVX2 loops that promises the same
// bits: run a computation under each capability (set_cpu_capability) and
// compare.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ember::testing {

// Whether this CPU has the AVX-512 subsets (F, BW, VL, DQ) the 16-lane kernels
// need.
bool cpu_has_avx512();

// fn's results under the AVX2 kernels and under the AVX-512 kernels, the same
// bits each (same_bits); the capability in force before is restored.
void expect_avx2_and_avx512_agree(const std::string &what, const std::function<std::vector<Tensor>()> &fn);

}  // namespace ember::testing
