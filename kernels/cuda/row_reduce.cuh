// Row teams for the per-row CUDA kernels (normalization.cu, fused_add_layer_norm.cu,
// fused_softmax.cu, reduce.cu, nn_functional_cross_entropy.cu): a row goes to one warp when it is short and
// to one block when it is long, and the team's reductions are warp shuffles joined through
// shared memory across the warps of a block. Kept in one place so every op splits rows and
// combines partial results the same way.
#pragma once
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember::cuda {

constexpr int kWarp = 32;
constexpr int kWarpRowThreads = 256;   // warp-per-row launches: 8 rows per block
constexpr int kBlockRowThreads = 512;  // block-per-row launches
constexpr int64_t kWarpRowMax = 1024;  // longer rows get a whole block

struct Sum {
  template <typename A> __device__ __forceinline__ A operator()(A a, A b) const { return a + b; }
};
// Max that keeps NaN: once either side is NaN the result is.
struct MaxNan {
  template <typename A> __device__ __forceinline__ A operator()(A a, A b) const {
    return (a != a || b != b) ? (a != a ? a : b) : (b > a ? b : a);
  }
};

// Butterfly reduction: every lane of the warp gets the result.
template <typename A, typename Op>
__device__ __forceinline__ A warp_reduce(A v, Op op) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Which rows a thread's team walks and where the thread stands in it: a warp, or the whole block.
template <bool kBlock> struct RowSlots;

template <> struct RowSlots<false> {
  static __device__ __forceinline__ int64_t first() {
    return int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  }
  static __device__ __forceinline__ int64_t step() { return int64_t(gridDim.x) * (blockDim.x / kWarp); }
  static __device__ __forceinline__ int lane() { return int(threadIdx.x % kWarp); }
  static __device__ __forceinline__ int width() { return kWarp; }
};

template <> struct RowSlots<true> {
  static __device__ __forceinline__ int64_t first() { return blockIdx.x; }
  static __device__ __forceinline__ int64_t step() { return gridDim.x; }
  static __device__ __forceinline__ int lane() { return int(threadIdx.x); }
  static __device__ __forceinline__ int width() { return int(blockDim.x); }
};

// The threads that share one row. Every member gets the reduction.
template <bool kBlock> struct RowTeam;

template <> struct RowTeam<false> : RowSlots<false> {
  template <typename A, typename Op> static __device__ __forceinline__ A reduce(A v, Op op, A) {
    return warp_reduce(v, op);
  }
};

template <> struct RowTeam<true> : RowSlots<true> {
  template <typename A, typename Op> static __device__ __forceinline__ A reduce(A v, Op op, A identity) {
    __shared__ A partial[kWarp];
    const int lane_in_warp = int(threadIdx.x % kWarp), warp = int(threadIdx.x / kWarp);
    const int warps = int(blockDim.x / kWarp);
    v = warp_reduce(v, op);
    __syncthreads();  // the previous reduction's readers are done with `partial`
    if (lane_in_warp == 0) partial[warp] = v;
    __syncthreads();
    v = lane_in_warp < warps ? partial[lane_in_warp] : identity;
    return warp_reduce(v, op);
  }
};

// Launches a per-row kernel, a warp per row for short rows and a block per row for long ones:
// launch(std::bool_constant<block per row>, grid, threads).
template <typename Launch>
void launch_rows(int64_t rows, int64_t len, Launch&& launch) {
  if (len <= kWarpRowMax) {
    launch(std::false_type{}, grid_for(rows * kWarp, kWarpRowThreads), kWarpRowThreads);
  } else {
    launch(std::true_type{}, grid_for(rows * kBlockRowThreads, kBlockRowThreads), kBlockRowThreads);
  }
  EMBER_CUDA_CHECK_LAUNCH();
}

}  // namespace ember::cuda
