// For kernels with an AVX-512 twin of their AVX2 loops that promises the same bits: run a
// computation under each capability (set_cpu_capability) on one thread and on two, and compare.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ember::testing {

// Whether this CPU has the AVX-512 subsets (F, BW, VL, DQ) the 16-lane kernels need.
bool cpu_has_avx512();

// fn's results under the AVX2 kernels on one thread, then under the AVX2 and the AVX-512 kernels
// on one and on two threads (the threads' shares group rows differently): the same bits as the
// first run each (same_bits). The capability and thread count in force before are restored.
void expect_avx2_and_avx512_agree(const std::string& what, const std::function<std::vector<Tensor>()>& fn);

}  // namespace ember::testing
