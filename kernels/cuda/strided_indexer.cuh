// Elementwise kernels over strided tensors: the geometry of N same-shaped operands, passed to
// a kernel by value, turns a linear element index into one element offset per operand.
// Dimensions are stored innermost first; size-1 dims are dropped and neighbours merged where
// every operand is contiguous across them, so a contiguous tensor costs no division at all.
#pragma once
#include <array>
#include <cstdint>

#include "core/native/views.h"
#include "core/tensor.h"
#include "kernels/cuda/cuda_runtime.h"

namespace ember::cuda {

constexpr int kMaxIndexDims = 10;

template <int N>
struct StridedIndexer {
  int ndim = 0;
  bool narrow = true;  // every linear index and size fits in 32 bits: cheaper division
  int64_t sizes[kMaxIndexDims] = {};
  int64_t strides[N][kMaxIndexDims] = {};  // in elements

  __device__ __forceinline__ void offsets(int64_t linear, int64_t (&off)[N]) const {
    if (ndim == 1) {  // contiguous or evenly strided: no division
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] = linear * strides[k][0];
      return;
    }
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    if (narrow) {
      uint32_t rest = uint32_t(linear);
#pragma unroll
      for (int d = 0; d < kMaxIndexDims; ++d) {
        if (d == ndim) break;
        const uint32_t size = uint32_t(sizes[d]);
        const uint32_t q = rest / size;
        const int64_t idx = int64_t(rest - q * size);
        rest = q;
#pragma unroll
        for (int k = 0; k < N; ++k) off[k] += idx * strides[k][d];
      }
    } else {
      int64_t rest = linear;
#pragma unroll
      for (int d = 0; d < kMaxIndexDims; ++d) {
        if (d == ndim) break;
        const int64_t q = rest / sizes[d];
        const int64_t idx = rest - q * sizes[d];
        rest = q;
#pragma unroll
        for (int k = 0; k < N; ++k) off[k] += idx * strides[k][d];
      }
    }
  }
};

// Builds the indexer for operands that all have `shape` (broadcast them first with
// native::expand). Returns false when more than kMaxIndexDims dims survive merging.
template <int N>
bool build_indexer(const Shape& shape, const std::array<Tensor, N>& ops, StridedIndexer<N>& ix) {
  int nd = 0;
  for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
    if (shape[size_t(d)] == 1) continue;
    // Merge into the dim inside it when each operand steps over it as one longer row.
    bool merge = nd > 0;
    for (int k = 0; k < N && merge; ++k)
      merge = ops[k].strides()[size_t(d)] == ix.strides[k][nd - 1] * ix.sizes[nd - 1];
    if (merge) {
      ix.sizes[nd - 1] *= shape[size_t(d)];
      continue;
    }
    if (nd == kMaxIndexDims) return false;
    ix.sizes[nd] = shape[size_t(d)];
    for (int k = 0; k < N; ++k) ix.strides[k][nd] = ops[k].strides()[size_t(d)];
    ++nd;
  }
  ix.ndim = nd;
  ix.narrow = numel_of(shape) <= int64_t(INT32_MAX);
  return true;
}

// Calls fn(indexer, numel, operands) for the whole geometry, or, for tensors with too many
// dims to index at once, once per slice along the outermost dim.
template <int N, typename Fn>
void for_each_indexable(const Shape& shape, const std::array<Tensor, N>& ops, const Fn& fn) {
  StridedIndexer<N> ix;
  if (build_indexer<N>(shape, ops, ix)) {
    fn(ix, numel_of(shape), ops);
    return;
  }
  const Shape inner(shape.begin() + 1, shape.end());
  for (int64_t i = 0; i < shape[0]; ++i) {
    std::array<Tensor, N> sub;
    for (int k = 0; k < N; ++k) sub[k] = native::select(ops[k], 0, i);
    for_each_indexable<N>(inner, sub, fn);
  }
}

// Blocks for a grid-stride loop over n items: enough to fill the device, no more.
inline unsigned grid_for(int64_t n, int threads_per_block) {
  const int64_t needed = (n + threads_per_block - 1) / threads_per_block;
  const int64_t cap = int64_t(multiprocessor_count(current_device())) * 16;
  return unsigned(needed < cap ? (needed > 0 ? needed : 1) : cap);
}

}  // namespace ember::cuda

// Raises the launch error of the kernel just queued, if any.
#define EMBER_CUDA_CHECK_LAUNCH() EMBER_CUDA_CHECK(cudaGetLastError())
