// Pieces shared by the CUDA attention kernels (fused_attention.cu and
// fused_attention_backward.cu): where each (batch, head) pair's rows lie, the additive mask read
// through its broadcast strides, tile loads into shared memory and the tile sizes per head dim.
//
// Every kernel runs kThreads threads seen as a 16 x 16 grid (tile row group rg = tid / 16, column
// lane cl = tid % 16): a thread owns rows rg, rg + 16, ... and columns cl, cl + 16, ... of each
// tile it computes, so all tile sizes are multiples of 16. Shared rows are padded by one element
// (row stride d + 1) so that the 16 lanes reading 16 different rows hit different banks.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <mutex>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/native/fused.h"
#include "core/tensor.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/device_types.cuh"

namespace ember::cuda::attention {

constexpr int kThreads = 256;
constexpr int kSide = 16;  // threads along each side of the 16 x 16 thread grid
constexpr int64_t kMaxHeadDim = 256;

// Dynamic shared memory of every attention kernel (one declaration for all instantiations).
extern __shared__ __align__(16) unsigned char attention_smem[];

// Where one operand's pair starts (pair = outer * inner + n) and how far apart its rows are, in elements.
struct PairStrides {
  int64_t outer = 0, inner = 0, row = 0;
};

struct Geometry {
  int64_t n_pairs, inner, len_q, len_k, d;  // d: the head dim of q, k and v alike
  bool causal;
  PairStrides q, k, v, o;  // o: the output and its gradient
  __host__ __device__ int64_t pairs() const { return n_pairs; }
  __device__ int64_t offset(const PairStrides& s, int64_t pair) const {
    return (pair / inner) * s.outer + (pair % inner) * s.inner;
  }
  // Whether key j takes part in query row i.
  __device__ bool sees(int64_t i, int64_t j) const { return i < len_q && j < len_k && (!causal || j <= i); }
  // The end of the keys any of query rows [i0, i0 + rows) sees.
  __device__ int64_t key_end(int64_t i0, int rows) const {
    return causal && i0 + rows < len_k ? i0 + rows : len_k;
  }
};

inline PairStrides pair_strides(const native::AttentionOperand& o) { return {o.outer_stride, o.inner_stride, o.row_stride}; }

// The CUDA kernels take one head dim for q, k and v (the caller runs the composition otherwise).
inline Geometry geometry_of(const native::AttentionProblem& a, const native::AttentionOperand& out, const char* op) {
  EMBER_CHECK(a.dim_qk == a.dim_v, op, ": the CUDA kernel takes one head dim for query, key and value, got ",
              a.dim_qk, " and ", a.dim_v);
  return {a.pairs(), a.inner, a.len_q, a.len_k, a.dim_qk, a.causal,
          pair_strides(a.q), pair_strides(a.k), pair_strides(a.v), pair_strides(out)};
}

struct MaskView {
  enum Kind : int { None = 0, F32 = 1, F64 = 2, BF16 = 3, F16 = 4 };
  const void* data = nullptr;
  int kind = None;
  int64_t stride[4] = {0, 0, 0, 0};

  template <typename A>
  __device__ __forceinline__ A at(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const int64_t off = b * stride[0] + h * stride[1] + i * stride[2] + j * stride[3];
    switch (kind) {
      case F32: return A(static_cast<const float*>(data)[off]);
      case F64: return A(static_cast<const double*>(data)[off]);
      case BF16: return A(__bfloat162float(static_cast<const __nv_bfloat16*>(data)[off]));
      case F16: return A(__half2float(static_cast<const __half*>(data)[off]));
      default: return A(0);
    }
  }
};

inline MaskView mask_view_of(const Tensor& mask, const char* op) {
  MaskView v;
  if (!mask.defined()) return v;
  EMBER_CHECK(mask.dim() == 4, op, ": mask must be broadcast to [batch, heads, len, len], got shape ", mask.shape());
  switch (mask.dtype()) {
    case DType::f32: v.kind = MaskView::F32; break;
    case DType::f64: v.kind = MaskView::F64; break;
    case DType::bf16: v.kind = MaskView::BF16; break;
    case DType::f16: v.kind = MaskView::F16; break;
    default: EMBER_FAIL(op, ": mask must be floating, got ", dtype_name(mask.dtype()));
  }
  v.data = mask.raw_data();
  for (int k = 0; k < 4; ++k) v.stride[k] = mask.strides()[size_t(k)];
  return v;
}

// Max that keeps NaN: once either side is NaN the result is (the CPU's row_max).
template <typename A>
__device__ __forceinline__ A max_nan(A a, A b) {
  return (a != a || b != b) ? (a != a ? a : b) : (b > a ? b : a);
}

template <typename A>
__device__ __forceinline__ A neg_inf() {
  return -std::numeric_limits<A>::infinity();
}

// dst[r * ld + c] = src row (row0 + r), column c (as A), for r < rows and c < d; rows at or
// past len read as zero. src rows are src_ld elements apart.
template <typename T, typename A>
__device__ __forceinline__ void load_rows(A* dst, int ld, const T* src, int64_t src_ld, int64_t row0, int rows,
                                          int64_t len, int d) {
  const int total = rows * d;
  for (int idx = int(threadIdx.x); idx < total; idx += kThreads) {
    const int r = idx / d, c = idx - r * d;
    const int64_t row = row0 + r;
    dst[r * ld + c] = row < len ? A(Acc<T>::load(src[row * src_ld + c])) : A(0);
  }
}

// The block's (pair, tile of ROWS rows) and where that pair's q, k and v rows start: blocks run
// over pairs outermost, then over row tiles.
template <typename T>
struct PairTile {
  int64_t pair, row0;
  const T* q;
  const T* k;
  const T* v;
};

template <int ROWS, typename T>
__device__ __forceinline__ PairTile<T> pair_tile(const Geometry& g, int64_t len, const T* q, const T* k, const T* v) {
  const int64_t tiles = (len + ROWS - 1) / ROWS;
  PairTile<T> t;
  t.pair = int64_t(blockIdx.x) / tiles;
  t.row0 = (int64_t(blockIdx.x) % tiles) * ROWS;
  t.q = q + g.offset(g.q, t.pair);
  t.k = k + g.offset(g.k, t.pair);
  t.v = v + g.offset(g.v, t.pair);
  return t;
}

template <typename A, int R, int C>
__device__ __forceinline__ void zero_tile(A (&acc)[R][C]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int c = 0; c < C; ++c) acc[r][c] = A(0);
}

// acc[r][c] += p[(rg + 16 r) * ldp + j] * v[j * ld + cl + 16 c] for j < n, in order of j: this
// thread's part of P V for a P tile in shared memory (row stride ldp) and n rows of V. Columns at
// or past d are skipped unless EXACT.
template <bool EXACT, typename A, int R, int C>
__device__ __forceinline__ void accumulate_pv(A (&acc)[R][C], const A* p, int ldp, const A* v, int ld, int n, int d,
                                              int rg, int cl) {
  for (int j = 0; j < n; ++j) {
    A pr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) pr[r] = p[(rg + kSide * r) * ldp + j];
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int x = cl + kSide * c;
      if (EXACT || x < d) {
        const A vv = v[j * ld + x];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][c] += pr[r] * vv;
      }
    }
  }
}

// fn(r, c, i, x) for each of this thread's R x C output entries that exist: row i = row0 + rg + 16 r
// below len, column x = cl + 16 c below d (always when EXACT).
template <bool EXACT, int R, int C, typename F>
__device__ __forceinline__ void for_tile_outputs(int64_t row0, int64_t len, int d, int rg, int cl, F&& fn) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t i = row0 + rg + kSide * r;
    if (i >= len) continue;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int x = cl + kSide * c;
      if (EXACT || x < d) fn(r, c, i, x);
    }
  }
}

// Row max and 1 / row sum of rows row0 + tid (tid < rows) from stats [pairs * len, 2]; zero past len.
template <typename A>
__device__ __forceinline__ void load_row_stats(A* s_max, A* s_inv, const A* stats, int64_t pair, int64_t row0,
                                               int rows, int64_t len) {
  const int tid = int(threadIdx.x);
  if (tid < rows) {
    const int64_t i = row0 + tid;
    s_max[tid] = i < len ? stats[2 * (pair * len + i)] : A(0);
    s_inv[tid] = i < len ? stats[2 * (pair * len + i) + 1] : A(0);
  }
}

// Tile sizes: BQ query rows and BK key rows per tile, head dims up to DMAX (EXACT: d == DMAX).
template <int BQ_, int BK_, int DMAX_, bool EXACT_>
struct Tiles {
  static constexpr int BQ = BQ_, BK = BK_, DMAX = DMAX_;
  static constexpr bool EXACT = EXACT_;
  static_assert(BQ % kSide == 0 && BK % kSide == 0 && DMAX % kSide == 0, "tiles are multiples of 16");
  static_assert(kThreads % BQ == 0 && kThreads / BQ <= 32 && BK % (kThreads / BQ) == 0, "softmax row split");
};

// fn(Tiles<...>{}) for head dim d (1 .. kMaxHeadDim) and compute type A: f32 tiles of 64 rows
// with the common head dims exact (no column guards), 32-row tiles for d above 128 and
// 16-row tiles for f64 (keeps shared memory within the 227 KiB of a block).
template <typename A, typename F>
void with_tiles(int64_t d, F&& fn) {
  if constexpr (std::is_same_v<A, double>) {
    if (d <= 64) return fn(Tiles<16, 16, 64, false>{});
    if (d <= 128) return fn(Tiles<16, 16, 128, false>{});
    return fn(Tiles<16, 16, 256, false>{});
  } else {
    if (d == 32) return fn(Tiles<64, 64, 32, true>{});
    if (d == 64) return fn(Tiles<64, 64, 64, true>{});
    if (d == 128) return fn(Tiles<64, 64, 128, true>{});
    if (d < 64) return fn(Tiles<64, 64, 64, false>{});
    if (d < 128) return fn(Tiles<64, 64, 128, false>{});
    return fn(Tiles<32, 32, 256, false>{});
  }
}

// Lets `Kernel` use up to `max_bytes` of dynamic shared memory (beyond the default 48 KiB) on
// the current device. Call it with the most any launch of that instantiation needs (its tile
// config's DMAX), before every launch: the attribute is set once per device, under a lock, and
// never lowered again, so threads launching it with different head dims cannot undo each
// other's limit between setting it and launching.
template <auto Kernel>
void allow_shared_memory(size_t max_bytes) {
  static std::mutex mu;
  static std::vector<bool> done;  // per device
  const int device = current_device();
  std::lock_guard<std::mutex> lock(mu);
  if (size_t(device) >= done.size()) done.resize(size_t(device) + 1, false);
  if (done[size_t(device)]) return;
  EMBER_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(max_bytes)));
  done[size_t(device)] = true;
}

}  // namespace ember::cuda::attention
