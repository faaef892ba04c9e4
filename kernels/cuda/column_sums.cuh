// Column sums over the rows of a [rows, cols] problem, for the parameter gradients of the row
// ops: layer norm's dweight and dbias (normalization.cu), the fused residual + layer norm's
// dweight, dbias and dx_bias (fused_add_layer_norm.cu). A block of (32, kColSumTileRows)
// threads owns 32 columns of one chunk of kColSumChunkRows rows and adds each column's values
// in double into one partial sum per chunk (its tile rows joined in a fixed order); a second
// kernel adds each column's chunks in chunk order and rounds once. The grid has a block per
// (32 columns, chunk), so a few hundred columns still fill the device, and since chunks have a
// fixed size and nothing is added atomically, the sums are the same bits on every run.
#pragma once
#include <cstdint>

#include "core/factory.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/row_reduce.cuh"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember::cuda {

constexpr int kColSumTileRows = 8;          // rows of a chunk walked side by side
constexpr int64_t kColSumChunkRows = 128;   // rows summed into one partial per column
constexpr int64_t kColSumMaxGridY = 65535;  // more chunks than this: blocks take several
constexpr int kColSumFinishThreads = 256;

// The K sums' outputs, in the compute type A; a null output is not written.
template <int K, typename A>
struct ColumnOutputs {
  A* out[K];
};

// partial[(k * chunks + chunk) * cols + j] = sum over the chunk's rows r of value k of (r, j),
// where values(r, j, v) writes the K values of element (r, j) into v.
template <int K, typename Values>
__global__ void column_partial_sums_kernel(double* partial, int64_t rows, int64_t cols, int64_t chunks,
                                           Values values) {
  __shared__ double part[K][kColSumTileRows][kWarp + 1];
  const int64_t j = int64_t(blockIdx.x) * kWarp + threadIdx.x;
  for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    const int64_t r0 = chunk * kColSumChunkRows;
    const int64_t r1 = r0 + kColSumChunkRows < rows ? r0 + kColSumChunkRows : rows;
    double acc[K];
#pragma unroll
    for (int k = 0; k < K; ++k) acc[k] = 0.0;
    if (j < cols) {
      for (int64_t r = r0 + threadIdx.y; r < r1; r += kColSumTileRows) {
        double v[K];
        values(r, j, v);
#pragma unroll
        for (int k = 0; k < K; ++k) acc[k] += v[k];
      }
    }
    __syncthreads();  // the previous chunk's sums have been read
#pragma unroll
    for (int k = 0; k < K; ++k) part[k][threadIdx.y][threadIdx.x] = acc[k];
    __syncthreads();
    if (threadIdx.y == 0 && j < cols) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        double s = 0.0;
        for (int t = 0; t < kColSumTileRows; ++t) s += part[k][t][threadIdx.x];
        partial[(k * chunks + chunk) * cols + j] = s;
      }
    }
  }
}

// out[k][j] = the chunks of column j added in chunk order (zero when there are no rows).
template <int K, typename A>
__global__ void column_sums_finish_kernel(ColumnOutputs<K, A> outs, const double* partial, int64_t chunks,
                                          int64_t cols) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < cols; j += int64_t(gridDim.x) * blockDim.x) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!outs.out[k]) continue;
      double s = 0.0;
      for (int64_t c = 0; c < chunks; ++c) s += partial[(k * chunks + c) * cols + j];
      outs.out[k][j] = A(s);
    }
  }
}

// Launches both passes on `stream`; the scratch of partial sums lives on `device` and goes back
// to the caching allocator in stream order.
template <int K, typename A, typename Values>
void column_sums(const ColumnOutputs<K, A>& outs, int64_t rows, int64_t cols, const Values& values, Device device,
                 cudaStream_t stream) {
  if (cols == 0) return;
  const int64_t chunks = (rows + kColSumChunkRows - 1) / kColSumChunkRows;
  const Tensor partial = empty({chunks > 0 ? K * chunks * cols : 1}, {DType::f64, device});
  double* pp = static_cast<double*>(partial.raw_data());
  if (chunks > 0) {
    const unsigned grid_y = unsigned(chunks < kColSumMaxGridY ? chunks : kColSumMaxGridY);
    const dim3 grid(unsigned((cols + kWarp - 1) / kWarp), grid_y);
    column_partial_sums_kernel<K, Values><<<grid, dim3(kWarp, kColSumTileRows), 0, stream>>>(pp, rows, cols, chunks,
                                                                                            values);
    EMBER_CUDA_CHECK_LAUNCH();
  }
  column_sums_finish_kernel<K, A><<<grid_for(cols, kColSumFinishThreads), kColSumFinishThreads, 0, stream>>>(
      outs, pp, chunks, cols);
  EMBER_CUDA_CHECK_LAUNCH();
}

}  // namespace ember::cuda
