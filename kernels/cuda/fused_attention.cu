// CUDA attention (packed_self_attention, scaled_dot_product_attention), forward (core/native/fused.h;
// semantics of kernels/cpu/fused_attention.cpp). The backward is in fused_attention_backward.cu.
//
// Flash-style: one block per (batch * head pair, tile of BQ query rows) keeps its q rows in
// shared memory and walks the keys in tiles of BK rows. Per key tile it forms the scores
// s = q k^T * scale + mask, updates each row's running max m and running sum l of exp(s - m)
// (online softmax; earlier partial results are rescaled by exp(m_old - m_new)), drops the
// unnormalised exponentials with the keep mask (times 1 / (1 - p)) and adds p v into f32 (f64
// for f64) register accumulators. At the end the rows are divided by l, which gives exactly
// dropout(softmax(.)) v as the CPU forms it, and (m, 1 / l) go to stats. No L x L buffer
// reaches memory except the keep mask.
//
// The CPU's special rows carry over: a NaN score makes its row NaN (max keeps NaN); a row whose
// scores are all -inf gets stats (-inf, NaN) and a NaN ctx row (the CPU's exp(-inf - -inf)).
// For the running max such a row uses 0 in place of -inf, so fully masked key tiles before a
// finite score add nothing instead of NaN. Causal rows stop at the last key tile they see (when
// no keep mask must be drawn for the rest). The keep mask element e = (pair * len_q + i) * len_k + j
// is drawn with the Philox stream of kernels/cuda/philox.cuh, bit for bit the CPU's.
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/native/fused.h"
#include "kernels/cuda/fused_attention_tile.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/philox.cuh"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember {
namespace {

using namespace cuda::attention;

template <typename A>
struct DropoutArgs {
  uint64_t seed = 0, offset = 0;
  uint32_t threshold = 0;
  A scale = A(1);
  uint8_t* keep = nullptr;  // null: no dropout
};

template <typename Cfg, typename A>
constexpr size_t forward_smem_elems(int64_t d) {
  const int64_t ld = d + 1;
  return size_t((Cfg::BQ + 2 * Cfg::BK) * ld + Cfg::BQ * (Cfg::BK + 1) + 3 * Cfg::BQ);
}

template <typename T, typename A, typename Cfg>
__global__ void __launch_bounds__(kThreads, 1)
    attention_forward_kernel(T* ctx, A* stats, const T* q, const T* k, const T* v, MaskView mask, Geometry g, A scale,
                             DropoutArgs<A> drop) {
  constexpr int BQ = Cfg::BQ, BK = Cfg::BK, DMAX = Cfg::DMAX;
  constexpr int RQ = BQ / kSide, RK = BK / kSide, RD = DMAX / kSide;
  constexpr int TPR = kThreads / BQ, CPT = BK / TPR;  // softmax: threads per row, columns per thread
  constexpr int lds = BK + 1;
  const int d = Cfg::EXACT ? DMAX : int(g.d);
  const int ld = d + 1;
  const int64_t len_q = g.len_q, len_k = g.len_k;
  const PairTile<T> tile = pair_tile<BQ>(g, len_q, q, k, v);
  const int64_t pair = tile.pair, i0 = tile.row0;
  const int64_t b = pair / g.inner, h = pair % g.inner;
  // Causal rows skip the key tiles they cannot see, unless the dropout mask must cover them.
  const int64_t key_end = drop.keep != nullptr ? len_k : g.key_end(i0, BQ);

  A* sq = reinterpret_cast<A*>(attention_smem);
  A* sk = sq + BQ * ld;
  A* sv = sk + BK * ld;
  A* ss = sv + BK * ld;      // [BQ][lds]: scores, then dropped exponentials
  A* s_max = ss + BQ * lds;  // running max per row
  A* s_sum = s_max + BQ;     // running sum per row
  A* s_alpha = s_sum + BQ;   // rescale factor of the last tile; at the end 1 / sum

  const int tid = int(threadIdx.x);
  const int rg = tid / kSide, cl = tid % kSide;
  const int srow = tid / TPR, spart = tid % TPR;

  load_rows(sq, ld, tile.q, g.q.row, i0, BQ, len_q, d);
  if (tid < BQ) {
    s_max[tid] = neg_inf<A>();
    s_sum[tid] = A(0);
  }
  A acc[RQ][RD];
  zero_tile(acc);

  for (int64_t j0 = 0; j0 < key_end; j0 += BK) {
    __syncthreads();  // the previous tile's readers of sk, sv, ss are done
    load_rows(sk, ld, tile.k, g.k.row, j0, BK, len_k, d);
    load_rows(sv, ld, tile.v, g.v.row, j0, BK, len_k, d);
    __syncthreads();

    // scores of this thread's RQ x RK entries
    A s[RQ][RK];
    zero_tile(s);
#pragma unroll 4
    for (int x = 0; x < d; ++x) {
      A qv[RQ], kv[RK];
#pragma unroll
      for (int r = 0; r < RQ; ++r) qv[r] = sq[(rg + kSide * r) * ld + x];
#pragma unroll
      for (int c = 0; c < RK; ++c) kv[c] = sk[(cl + kSide * c) * ld + x];
#pragma unroll
      for (int r = 0; r < RQ; ++r)
#pragma unroll
        for (int c = 0; c < RK; ++c) s[r][c] += qv[r] * kv[c];
    }
#pragma unroll
    for (int r = 0; r < RQ; ++r) {
      const int64_t i = i0 + rg + kSide * r;
#pragma unroll
      for (int c = 0; c < RK; ++c) {
        const int64_t j = j0 + cl + kSide * c;
        A val = neg_inf<A>();  // rows and columns past len take no part
        if (g.sees(i, j)) val = s[r][c] * scale + mask.at<A>(b, h, i, j);
        ss[(rg + kSide * r) * lds + cl + kSide * c] = val;
      }
    }
    __syncthreads();

    // online softmax: TPR neighbouring lanes share row srow, CPT consecutive columns each
    {
      A* row = ss + srow * lds + spart * CPT;
      A tile_max = neg_inf<A>();
#pragma unroll
      for (int c = 0; c < CPT; ++c) tile_max = max_nan(tile_max, row[c]);
#pragma unroll
      for (int off = TPR / 2; off > 0; off >>= 1)
        tile_max = max_nan(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
      const A m_old = s_max[srow];
      const A m_new = max_nan(m_old, tile_max);
      const A m_use = m_new == neg_inf<A>() ? A(0) : m_new;
      const int64_t i = i0 + srow;
      const int64_t jb = j0 + spart * CPT;
      const int64_t e0 = (pair * len_q + i) * len_k + jb;  // keep-mask element of column jb
      uint64_t cached = ~uint64_t(0);
      uint4 words = make_uint4(0, 0, 0, 0);
      A sum = A(0);
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
        A p = d_exp(row[c] - m_use);
        sum += p;
        if (drop.keep != nullptr && i < len_q && jb + c < len_k) {
          const uint64_t e = uint64_t(e0 + c);
          const uint64_t counter = drop.offset + e / 4;
          if (counter != cached) {
            words = cuda::philox(drop.seed, counter);
            cached = counter;
          }
          const uint32_t w = (e & 3) == 0 ? words.x : (e & 3) == 1 ? words.y : (e & 3) == 2 ? words.z : words.w;
          const bool kept = (w >> 8) >= drop.threshold;
          drop.keep[e] = kept ? 1 : 0;
          p *= kept ? drop.scale : A(0);  // a product, as the CPU's: NaN stays NaN
        }
        row[c] = p;
      }
#pragma unroll
      for (int off = TPR / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      const A alpha = d_exp(m_old - m_use);
      __syncthreads();  // every lane of the row has read s_max before it changes
      if (spart == 0) {
        s_max[srow] = m_new;
        s_sum[srow] = s_sum[srow] * alpha + sum;
        s_alpha[srow] = alpha;
      }
    }
    __syncthreads();

    // acc = acc * alpha + p v over this tile's keys
    const int keys = int(len_k - j0 < BK ? len_k - j0 : BK);
#pragma unroll
    for (int r = 0; r < RQ; ++r) {
      const A alpha = s_alpha[rg + kSide * r];
#pragma unroll
      for (int c = 0; c < RD; ++c) acc[r][c] *= alpha;
    }
    accumulate_pv<Cfg::EXACT>(acc, ss, lds, sv, ld, keys, d, rg, cl);
  }

  __syncthreads();
  if (tid < BQ) {
    const A m = s_max[tid];
    const A inv = m == neg_inf<A>() ? std::numeric_limits<A>::quiet_NaN() : A(1) / s_sum[tid];
    s_alpha[tid] = inv;
    const int64_t i = i0 + tid;
    if (i < len_q) {
      stats[2 * (pair * len_q + i)] = m;
      stats[2 * (pair * len_q + i) + 1] = inv;
    }
  }
  __syncthreads();
  T* out = ctx + g.offset(g.o, pair);
  A inv[RQ];
#pragma unroll
  for (int r = 0; r < RQ; ++r) inv[r] = s_alpha[rg + kSide * r];
  for_tile_outputs<Cfg::EXACT, RQ, RD>(i0, len_q, d, rg, cl, [&](int r, int c, int64_t i, int x) {
    out[i * g.o.row + x] = cuda::Acc<T>::store(acc[r][c] * inv[r]);
  });
}

void attention_cuda(const native::AttentionProblem& a, const native::AttentionOperand& out, const Tensor& stats,
                    const Tensor& keep, const native::FusedDropout& dropout) {
  constexpr const char* op = "attention";
  const Device dev = a.q.data.device();
  cuda::DeviceGuard guard(dev, op);
  const Geometry g = geometry_of(a, out, op);
  if (g.pairs() == 0 || g.len_q == 0 || g.d == 0) return;
  EMBER_CHECK(g.d <= kMaxHeadDim, op, ": the CUDA kernel takes head dims up to ", kMaxHeadDim, ", got ", g.d);
  EMBER_CHECK(stats.is_contiguous(), op, ": stats must be contiguous");
  EMBER_CHECK(!dropout.active() || (keep.defined() && keep.is_contiguous()), op,
              ": dropout needs a contiguous keep mask");
  const MaskView mv = mask_view_of(a.mask, op);
  const DType dt = a.q.data.dtype();
  EMBER_CHECK(dt == DType::f32 || dt == DType::bf16 || dt == DType::f64, op, ": q, k and v must be f32, bf16 or f64, got ",
              dtype_name(dt));
  cuda::visit_device_type(dt, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, __nv_bfloat16>) {
      using A = cuda::device_acc_t<T>;
      DropoutArgs<A> drop;
      if (dropout.active()) {
        drop.seed = dropout.state.seed;
        drop.offset = dropout.state.offset;
        drop.threshold = cuda::dropout_threshold(dropout.p);
        drop.scale = A(dropout.scale);
        drop.keep = reinterpret_cast<uint8_t*>(keep.data_ptr<bool>());
      }
      with_tiles<A>(g.d, [&](auto cfg) {
        using Cfg = decltype(cfg);
        const size_t bytes = forward_smem_elems<Cfg, A>(g.d) * sizeof(A);
        constexpr auto kernel = attention_forward_kernel<T, A, Cfg>;
        allow_shared_memory<kernel>(forward_smem_elems<Cfg, A>(Cfg::DMAX) * sizeof(A));
        const int64_t blocks = g.pairs() * ((g.len_q + Cfg::BQ - 1) / Cfg::BQ);
        EMBER_CHECK(blocks <= std::numeric_limits<int32_t>::max(), op, ": too many (batch, head, row tile) blocks");
        kernel<<<unsigned(blocks), kThreads, bytes, cuda::current_stream()>>>(
            static_cast<T*>(out.data.raw_data()), static_cast<A*>(stats.raw_data()),
            static_cast<const T*>(a.q.data.raw_data()), static_cast<const T*>(a.k.data.raw_data()),
            static_cast<const T*>(a.v.data.raw_data()), mv, g, A(a.scale), drop);
        EMBER_CUDA_CHECK_LAUNCH();
      });
    }
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::attention_stub, CUDA, &attention_cuda);

}  // namespace ember
