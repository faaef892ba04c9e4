// CUDA multi-head self-attention on one packed projection, backward (core/native/fused.h;
// semantics of kernels/cpu/fused_attention.cpp). The forward is in fused_attention.cu.
//
// The probabilities are recomputed tile by tile from q, k, the mask and the saved row stats,
// P = exp(q k^T * scale + mask - max) * inv_sum, never stored whole. With f = keep ? 1 / (1 - p)
// : 0 (1 without dropout) and dP = (dO v^T) f:
//   dV = (P f)^T dO,  delta_i = sum_j P_ij dP_ij,  dS = P (dP - delta) * scale,
//   dQ = dS K,        dK = dS^T Q,
// the CPU's formulas. Two kernels, each output element owned by one thread, so no atomics and
// the same result on every run:
//   - per (pair, tile of BQ query rows): a first sweep over the key tiles sums delta for its
//     rows (written to a scratch buffer), a second one forms dS and accumulates dQ;
//   - per (pair, tile of BK key rows), after the first: a sweep over the query tiles (reading
//     delta) accumulates dK and dV.
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/factory.h"
#include "core/native/fused.h"
#include "kernels/cuda/fused_attention_tile.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember {
namespace {

using namespace cuda::attention;

// What both kernels read besides q, k, v and the gradient.
template <typename A>
struct BackwardArgs {
  MaskView mask;
  const A* stats;         // [pairs * len_q, 2]: row max, 1 / row sum
  const uint8_t* keep;    // [pairs, len_q, len_k] or null without dropout
  PairStrides dq, dk, dv; // where the gradients go
  A scale, dropout_scale;
};

// P and dP f of entry (i, j) of pair `pair` from its raw dot products qk = q_i . k_j and
// gv = dO_i . v_j; zero past len.
template <typename A>
struct Entry {
  A p, dp, f;
};

template <typename A>
__device__ __forceinline__ Entry<A> entry(const BackwardArgs<A>& a, const Geometry& g, int64_t pair, int64_t i,
                                          int64_t j, A qk, A gv, A row_max, A row_inv) {
  Entry<A> r{A(0), A(0), A(0)};
  if (!g.sees(i, j)) return r;
  const A s = qk * a.scale + a.mask.template at<A>(pair / g.inner, pair % g.inner, i, j);
  r.p = d_exp(s - row_max) * row_inv;
  r.f = A(1);
  if (a.keep != nullptr) r.f = a.keep[(pair * g.len_q + i) * g.len_k + j] ? a.dropout_scale : A(0);
  r.dp = gv * r.f;
  return r;
}

// Raw dot products of this thread's R1 x R2 entries: s = X Y^T and t = U W^T over the first d
// columns of row tiles x, u (rows rg + 16 r) and y, w (rows cl + 16 c), all with row stride ld.
template <typename A, int R1, int R2>
__device__ __forceinline__ void dot_tiles(A (&s)[R1][R2], A (&t)[R1][R2], const A* x, const A* y, const A* u,
                                          const A* w, int ld, int d, int rg, int cl) {
  zero_tile(s);
  zero_tile(t);
#pragma unroll 2
  for (int k = 0; k < d; ++k) {
    A xv[R1], uv[R1], yv[R2], wv[R2];
#pragma unroll
    for (int r = 0; r < R1; ++r) {
      xv[r] = x[(rg + kSide * r) * ld + k];
      uv[r] = u[(rg + kSide * r) * ld + k];
    }
#pragma unroll
    for (int c = 0; c < R2; ++c) {
      yv[c] = y[(cl + kSide * c) * ld + k];
      wv[c] = w[(cl + kSide * c) * ld + k];
    }
#pragma unroll
    for (int r = 0; r < R1; ++r)
#pragma unroll
      for (int c = 0; c < R2; ++c) {
        s[r][c] += xv[r] * yv[c];
        t[r][c] += uv[r] * wv[c];
      }
  }
}

template <typename Cfg>
constexpr size_t dq_smem_elems(int64_t d) {
  return size_t((2 * Cfg::BQ + 2 * Cfg::BK) * (d + 1) + Cfg::BQ * (Cfg::BK + 1) + 2 * Cfg::BQ);
}
template <typename Cfg>
constexpr size_t dkv_smem_elems(int64_t d) {
  return size_t((2 * Cfg::BQ + 2 * Cfg::BK) * (d + 1) + 2 * Cfg::BQ * (Cfg::BK + 1) + 3 * Cfg::BQ);
}

// delta and dQ of one (pair, query tile).
template <typename T, typename A, typename Cfg>
__global__ void __launch_bounds__(kThreads, 1)
    attention_dq_kernel(T* dq_out, A* delta_out, const T* grad, const T* q, const T* k, const T* v, Geometry g,
                        BackwardArgs<A> a) {
  constexpr int BQ = Cfg::BQ, BK = Cfg::BK, DMAX = Cfg::DMAX;
  constexpr int RQ = BQ / kSide, RK = BK / kSide, RD = DMAX / kSide;
  constexpr int lds = BK + 1;
  const int d = Cfg::EXACT ? DMAX : int(g.d);
  const int ld = d + 1;
  const int64_t len_q = g.len_q, len_k = g.len_k;
  const PairTile<T> tile = pair_tile<BQ>(g, len_q, q, k, v);
  const int64_t pair = tile.pair, i0 = tile.row0;
  const int64_t key_end = g.key_end(i0, BQ);  // causal rows skip the keys they cannot see

  A* sq = reinterpret_cast<A*>(attention_smem);
  A* sg = sq + BQ * ld;
  A* sk = sg + BQ * ld;
  A* sv = sk + BK * ld;
  A* ss = sv + BK * ld;  // [BQ][lds]: dS
  A* s_max = ss + BQ * lds;
  A* s_inv = s_max + BQ;

  const int tid = int(threadIdx.x);
  const int rg = tid / kSide, cl = tid % kSide;
  load_rows(sq, ld, tile.q, g.q.row, i0, BQ, len_q, d);
  load_rows(sg, ld, grad + g.offset(g.o, pair), g.o.row, i0, BQ, len_q, d);
  load_row_stats(s_max, s_inv, a.stats, pair, i0, BQ, len_q);

  // sweep 1: delta_i = sum_j P_ij dP_ij
  A delta[RQ];
#pragma unroll
  for (int r = 0; r < RQ; ++r) delta[r] = A(0);
  for (int64_t j0 = 0; j0 < key_end; j0 += BK) {
    __syncthreads();
    load_rows(sk, ld, tile.k, g.k.row, j0, BK, len_k, d);
    load_rows(sv, ld, tile.v, g.v.row, j0, BK, len_k, d);
    __syncthreads();
    A s[RQ][RK], t[RQ][RK];
    dot_tiles(s, t, sq, sk, sg, sv, ld, d, rg, cl);
#pragma unroll
    for (int r = 0; r < RQ; ++r) {
      const int row = rg + kSide * r;
#pragma unroll
      for (int c = 0; c < RK; ++c) {
        const Entry<A> en = entry(a, g, pair, i0 + row, j0 + cl + kSide * c, s[r][c], t[r][c], s_max[row], s_inv[row]);
        delta[r] += en.p * en.dp;
      }
    }
  }
  // the 16 lanes of a row group are neighbours in one warp
#pragma unroll
  for (int r = 0; r < RQ; ++r) {
#pragma unroll
    for (int off = kSide / 2; off > 0; off >>= 1) delta[r] += __shfl_xor_sync(0xffffffffu, delta[r], off);
    const int64_t i = i0 + rg + kSide * r;
    if (cl == 0 && i < len_q) delta_out[pair * len_q + i] = delta[r];
  }

  // sweep 2: dQ = dS K
  A acc[RQ][RD];
  zero_tile(acc);
  for (int64_t j0 = 0; j0 < key_end; j0 += BK) {
    __syncthreads();
    load_rows(sk, ld, tile.k, g.k.row, j0, BK, len_k, d);
    load_rows(sv, ld, tile.v, g.v.row, j0, BK, len_k, d);
    __syncthreads();
    {
      A s[RQ][RK], t[RQ][RK];
      dot_tiles(s, t, sq, sk, sg, sv, ld, d, rg, cl);
#pragma unroll
      for (int r = 0; r < RQ; ++r) {
        const int row = rg + kSide * r;
#pragma unroll
        for (int c = 0; c < RK; ++c) {
          const Entry<A> en =
              entry(a, g, pair, i0 + row, j0 + cl + kSide * c, s[r][c], t[r][c], s_max[row], s_inv[row]);
          ss[row * lds + cl + kSide * c] = en.p * (en.dp - delta[r]) * a.scale;
        }
      }
    }
    __syncthreads();
    const int keys = int(len_k - j0 < BK ? len_k - j0 : BK);
    accumulate_pv<Cfg::EXACT>(acc, ss, lds, sk, ld, keys, d, rg, cl);
  }
  T* dq = dq_out + g.offset(a.dq, pair);
  for_tile_outputs<Cfg::EXACT, RQ, RD>(i0, len_q, d, rg, cl, [&](int r, int c, int64_t i, int x) {
    dq[i * a.dq.row + x] = cuda::Acc<T>::store(acc[r][c]);
  });
}

// dK and dV of one (pair, key tile), from delta of every query row.
template <typename T, typename A, typename Cfg>
__global__ void __launch_bounds__(kThreads, 1)
    attention_dkv_kernel(T* dk_base, T* dv_base, const A* delta, const T* grad, const T* q, const T* k, const T* v,
                         Geometry g, BackwardArgs<A> a) {
  constexpr int BQ = Cfg::BQ, BK = Cfg::BK, DMAX = Cfg::DMAX;
  constexpr int RQ = BQ / kSide, RK = BK / kSide, RD = DMAX / kSide;
  constexpr int lds = BK + 1;
  const int d = Cfg::EXACT ? DMAX : int(g.d);
  const int ld = d + 1;
  const int64_t len_q = g.len_q, len_k = g.len_k;
  const PairTile<T> tile = pair_tile<BK>(g, len_k, q, k, v);
  const int64_t pair = tile.pair, j0 = tile.row0;
  const T* go = grad + g.offset(g.o, pair);
  // causal: query rows above j0 see none of this tile's keys
  const int64_t rows_begin = g.causal ? (j0 / BQ) * BQ : 0;

  A* sk = reinterpret_cast<A*>(attention_smem);
  A* sv = sk + BK * ld;
  A* sq = sv + BK * ld;
  A* sg = sq + BQ * ld;
  A* sp = sg + BQ * ld;  // [BQ][lds]: P f
  A* ss = sp + BQ * lds; // [BQ][lds]: dS
  A* s_max = ss + BQ * lds;
  A* s_inv = s_max + BQ;
  A* s_delta = s_inv + BQ;

  const int tid = int(threadIdx.x);
  const int rg = tid / kSide, cl = tid % kSide;
  load_rows(sk, ld, tile.k, g.k.row, j0, BK, len_k, d);
  load_rows(sv, ld, tile.v, g.v.row, j0, BK, len_k, d);

  // dK and dV rows j0 + rg + 16 r, columns cl + 16 c
  A dk[RK][RD], dv[RK][RD];
  zero_tile(dk);
  zero_tile(dv);

  for (int64_t i0 = rows_begin; i0 < len_q; i0 += BQ) {
    __syncthreads();
    load_rows(sq, ld, tile.q, g.q.row, i0, BQ, len_q, d);
    load_rows(sg, ld, go, g.o.row, i0, BQ, len_q, d);
    load_row_stats(s_max, s_inv, a.stats, pair, i0, BQ, len_q);
    if (tid < BQ) s_delta[tid] = i0 + tid < len_q ? delta[pair * len_q + i0 + tid] : A(0);
    __syncthreads();
    {
      A s[RQ][RK], t[RQ][RK];
      dot_tiles(s, t, sq, sk, sg, sv, ld, d, rg, cl);
#pragma unroll
      for (int r = 0; r < RQ; ++r) {
        const int row = rg + kSide * r;
#pragma unroll
        for (int c = 0; c < RK; ++c) {
          const int col = cl + kSide * c;
          const Entry<A> en = entry(a, g, pair, i0 + row, j0 + col, s[r][c], t[r][c], s_max[row], s_inv[row]);
          sp[row * lds + col] = en.p * en.f;
          ss[row * lds + col] = en.p * (en.dp - s_delta[row]) * a.scale;
        }
      }
    }
    __syncthreads();
    const int rows = int(len_q - i0 < BQ ? len_q - i0 : BQ);
    for (int i = 0; i < rows; ++i) {
      A pv[RK], dsv[RK];
#pragma unroll
      for (int r = 0; r < RK; ++r) {
        pv[r] = sp[i * lds + rg + kSide * r];
        dsv[r] = ss[i * lds + rg + kSide * r];
      }
#pragma unroll
      for (int c = 0; c < RD; ++c) {
        const int x = cl + kSide * c;
        if (Cfg::EXACT || x < d) {
          const A gv = sg[i * ld + x], qv = sq[i * ld + x];
#pragma unroll
          for (int r = 0; r < RK; ++r) {
            dv[r][c] += pv[r] * gv;
            dk[r][c] += dsv[r] * qv;
          }
        }
      }
    }
  }
  T* dk_out = dk_base + g.offset(a.dk, pair);
  T* dv_out = dv_base + g.offset(a.dv, pair);
  for_tile_outputs<Cfg::EXACT, RK, RD>(j0, len_k, d, rg, cl, [&](int r, int c, int64_t j, int x) {
    dk_out[j * a.dk.row + x] = cuda::Acc<T>::store(dk[r][c]);
    dv_out[j * a.dv.row + x] = cuda::Acc<T>::store(dv[r][c]);
  });
}

void attention_backward_cuda(const native::AttentionProblem& ap, const native::AttentionOperand& grad,
                             const native::AttentionOperand& dq, const native::AttentionOperand& dk,
                             const native::AttentionOperand& dv, const Tensor& stats, const Tensor& keep,
                             double dropout_scale) {
  constexpr const char* op = "attention_backward";
  const Device dev = ap.q.data.device();
  cuda::DeviceGuard guard(dev, op);
  const Geometry g = geometry_of(ap, grad, op);
  if (g.pairs() == 0 || g.len_q == 0 || g.len_k == 0 || g.d == 0) return;
  EMBER_CHECK(g.d <= kMaxHeadDim, op, ": the CUDA kernel takes head dims up to ", kMaxHeadDim, ", got ", g.d);
  EMBER_CHECK(stats.is_contiguous(), op, ": stats must be contiguous");
  EMBER_CHECK(!keep.defined() || keep.is_contiguous(), op, ": the keep mask must be contiguous");
  const DType dt = ap.q.data.dtype();
  EMBER_CHECK(dt == DType::f32 || dt == DType::bf16 || dt == DType::f64, op, ": q, k and v must be f32, bf16 or f64, got ",
              dtype_name(dt));
  const MaskView mv = mask_view_of(ap.mask, op);
  cuda::visit_device_type(dt, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, __nv_bfloat16>) {
      using A = cuda::device_acc_t<T>;
      BackwardArgs<A> args{mv,
                           static_cast<const A*>(stats.raw_data()),
                           keep.defined() ? reinterpret_cast<const uint8_t*>(keep.data_ptr<bool>()) : nullptr,
                           pair_strides(dq),
                           pair_strides(dk),
                           pair_strides(dv),
                           A(ap.scale),
                           A(dropout_scale)};
      const Tensor delta = empty({g.pairs() * g.len_q}, {dtype_of<A>::value, dev});
      A* delta_ptr = static_cast<A*>(delta.raw_data());
      const T* go = static_cast<const T*>(grad.data.raw_data());
      const T* q = static_cast<const T*>(ap.q.data.raw_data());
      const T* k = static_cast<const T*>(ap.k.data.raw_data());
      const T* v = static_cast<const T*>(ap.v.data.raw_data());
      with_tiles<A>(g.d, [&](auto cfg) {
        using Cfg = decltype(cfg);
        const int64_t q_blocks = g.pairs() * ((g.len_q + Cfg::BQ - 1) / Cfg::BQ);
        const int64_t k_blocks = g.pairs() * ((g.len_k + Cfg::BK - 1) / Cfg::BK);
        EMBER_CHECK(q_blocks <= std::numeric_limits<int32_t>::max() && k_blocks <= std::numeric_limits<int32_t>::max(),
                    op, ": too many (batch, head, row tile) blocks");
        const size_t dq_bytes = dq_smem_elems<Cfg>(g.d) * sizeof(A);
        constexpr auto dq_kernel = attention_dq_kernel<T, A, Cfg>;
        allow_shared_memory<dq_kernel>(dq_smem_elems<Cfg>(Cfg::DMAX) * sizeof(A));
        dq_kernel<<<unsigned(q_blocks), kThreads, dq_bytes, cuda::current_stream()>>>(
            static_cast<T*>(dq.data.raw_data()), delta_ptr, go, q, k, v, g, args);
        EMBER_CUDA_CHECK_LAUNCH();
        const size_t dkv_bytes = dkv_smem_elems<Cfg>(g.d) * sizeof(A);
        constexpr auto dkv_kernel = attention_dkv_kernel<T, A, Cfg>;
        allow_shared_memory<dkv_kernel>(dkv_smem_elems<Cfg>(Cfg::DMAX) * sizeof(A));
        dkv_kernel<<<unsigned(k_blocks), kThreads, dkv_bytes, cuda::current_stream()>>>(
            static_cast<T*>(dk.data.raw_data()), static_cast<T*>(dv.data.raw_data()), delta_ptr, go, q, k, v, g, args);
        EMBER_CUDA_CHECK_LAUNCH();
      });
    }
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::attention_backward_stub, CUDA, &attention_backward_cuda);

}  // namespace ember
