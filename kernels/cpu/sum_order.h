// The order in which the CPU sum() adds a contiguous row (reduce.cpp), shared with the
// row-sparse sum of squares (fused_optim_rows.cpp), which must add in the same order to give
// the same bits: the row is cut into chunks of kSumRowChunk elements whose partial sums are
// added in order; within a chunk, element j goes to accumulator j % kSumLanes while a whole
// group of kSumLanes remains, the accumulators are added in order and the rest after them.
#pragma once
#include <cstdint>

namespace ember::cpu {

constexpr int64_t kSumRowChunk = 16384;
constexpr int kSumLanes = 8;

}  // namespace ember::cpu
