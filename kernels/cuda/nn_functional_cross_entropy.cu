// CUDA cross-entropy, forward and backward (core/native/nn_functional.h), semantics as
// kernels/cpu/nn_functional_cross_entropy.cpp: logits [N, C, D], target [N, D], 16-bit types computed in
// float, f64 in double, per-row losses in double.
//
// Forward: each (n, d) row is read once. Every thread keeps an online (max, sum of exp
// relative to that max, plain sum) over its elements; the triples merge in a fixed shuffle
// tree, so the log-sum-exp and the smoothing sum come out of a single pass. For D == 1 the
// rows are contiguous and go to one warp each (one block each for long rows, as in
// normalization.cu); for D > 1 each thread owns one row and walks it with stride D, so
// neighbouring threads read neighbouring elements. Row losses go to a double buffer; one
// block then sums them (and counts the non-ignored targets) in a fixed order, so Mean and Sum
// are the same bits on every run. That block also writes the count next to the bad-target
// flag, and the host reads the three words back in one copy and raises like the CPU.
//
// Backward: one thread per logit, grad = g * (exp(x - lse) - eps / C), minus g * (1 - eps) at
// the target, zero on ignored rows.
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/factory.h"
#include "core/native/nn_functional.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/dtype_io.cuh"
#include "kernels/cuda/row_reduce.cuh"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember {
namespace {

using native::CrossEntropyArgs;

using cuda::kWarp;
constexpr int kThreads = 256;          // warp-per-row and thread-per-element kernels
constexpr int kRowThreads = 512;       // block-per-row kernel
using cuda::kWarpRowMax;               // longer rows get a whole block
constexpr int kSumThreads = 512;       // the single block that reduces the row losses

// status words: [0] count of non-ignored targets, [1] bad-target flag, [2] the bad target
constexpr int kStatusWords = 3;

template <typename A> __device__ __forceinline__ A neg_inf() { return -std::numeric_limits<A>::infinity(); }

// Online log-sum-exp state: max m (never NaN), s = sum of exp(x - m), sum = plain sum.
template <typename A> struct RowState {
  A m, s, sum;
};

template <typename A> __device__ __forceinline__ RowState<A> empty_state() { return {neg_inf<A>(), A(0), A(0)}; }

template <typename A> __device__ __forceinline__ void add_value(RowState<A>& st, A v) {
  st.sum += v;
  if (v > st.m) {
    // exp(-inf) = 0 for the first finite value; a +inf logit makes the row NaN, as the CPU's
    // exp(inf - inf) does
    st.s = st.s * d_exp(st.m - v) + (v == -neg_inf<A>() ? std::numeric_limits<A>::quiet_NaN() : A(1));
    st.m = v;
  } else {
    // -inf against a max of -inf adds nothing (exp(NaN) would); NaN values make s NaN
    st.s += (v == st.m && v == neg_inf<A>()) ? A(0) : d_exp(v - st.m);
  }
}

template <typename A> __device__ __forceinline__ RowState<A> merge(const RowState<A>& a, const RowState<A>& b) {
  const A m = b.m > a.m ? b.m : a.m;
  const A fa = a.m == neg_inf<A>() ? A(0) : d_exp(a.m - m);
  const A fb = b.m == neg_inf<A>() ? A(0) : d_exp(b.m - m);
  return {m, a.s * fa + b.s * fb, a.sum + b.sum};
}

template <typename A> __device__ __forceinline__ RowState<A> warp_merge(RowState<A> st) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) {
    const RowState<A> o{__shfl_xor_sync(0xffffffffu, st.m, offset), __shfl_xor_sync(0xffffffffu, st.s, offset),
                        __shfl_xor_sync(0xffffffffu, st.sum, offset)};
    st = merge(st, o);
  }
  return st;
}

// The threads that share one row: a warp, or the whole block. Every member gets the merge.
template <bool kBlock> struct RowTeam;

template <> struct RowTeam<false> : cuda::RowSlots<false> {
  template <typename A> static __device__ __forceinline__ RowState<A> reduce(RowState<A> st) { return warp_merge(st); }
};

template <> struct RowTeam<true> : cuda::RowSlots<true> {
  template <typename A> static __device__ __forceinline__ RowState<A> reduce(RowState<A> st) {
    __shared__ A pm[kWarp], ps[kWarp], psum[kWarp];
    const int lane_in_warp = int(threadIdx.x % kWarp), warp = int(threadIdx.x / kWarp);
    const int warps = int(blockDim.x / kWarp);
    st = warp_merge(st);
    __syncthreads();  // the previous row's readers are done with the shared words
    if (lane_in_warp == 0) {
      pm[warp] = st.m;
      ps[warp] = st.s;
      psum[warp] = st.sum;
    }
    __syncthreads();
    st = lane_in_warp < warps ? RowState<A>{pm[lane_in_warp], ps[lane_in_warp], psum[lane_in_warp]} : empty_state<A>();
    return warp_merge(st);
  }
};

// O is the loss type: T itself, or the accumulation type A.
template <typename T, typename O>
__device__ __forceinline__ O store_loss(cuda::device_acc_t<T> v) {
  if constexpr (std::is_same_v<O, T>) return cuda::Acc<T>::store(v);
  else return O(v);
}

// Bad target: raise the flag once and keep the first value that got there.
__device__ __forceinline__ void flag_bad_target(int64_t* status, int64_t t) {
  auto* flag = reinterpret_cast<unsigned long long*>(status + 1);
  if (atomicCAS(flag, 0ull, 1ull) == 0ull) status[2] = t;
}

struct RowParams {
  int64_t rows, c, d, ignore_index;
  double eps;
  bool none;  // Reduction::None: write each row's loss
};

// Row r's log-sum-exp and loss from its merged statistics (one thread of the team).
template <typename T, typename O>
__device__ __forceinline__ void finish_row(const RowState<cuda::device_acc_t<T>>& st, cuda::device_acc_t<T> target_logit,
                                           int64_t r, const RowParams& p, cuda::device_acc_t<T>* lse, double* row_loss,
                                           O* out) {
  using A = cuda::device_acc_t<T>;
  // a row of -inf only: NaN, as the CPU's exp(-inf - -inf)
  const A l = st.m == neg_inf<A>() ? std::numeric_limits<A>::quiet_NaN() : st.m + d_log(st.s);
  lse[r] = l;
  double v = double(l) - double(target_logit);
  if (p.eps > 0) v = (1.0 - p.eps) * v + p.eps * (double(l) - double(st.sum) / double(p.c));
  row_loss[r] = v;
  if (p.none) out[r] = store_loss<T, O>(A(v));
}

// Ignored or bad target: the row contributes nothing. Returns true when the row is done.
template <typename T, typename O>
__device__ __forceinline__ bool skip_row(int64_t t, int64_t r, const RowParams& p, cuda::device_acc_t<T>* lse,
                                         double* row_loss, O* out, int64_t* status, bool writer) {
  using A = cuda::device_acc_t<T>;
  const bool ignored = t == p.ignore_index;
  if (!ignored && t >= 0 && t < p.c) return false;
  if (writer) {
    if (!ignored) flag_bad_target(status, t);
    lse[r] = A(0);
    row_loss[r] = 0.0;
    if (p.none) out[r] = store_loss<T, O>(A(0));
  }
  return true;
}

// D == 1: rows of C contiguous logits, a warp or a block per row.
template <typename T, typename I, typename O, bool kBlock>
__global__ void ce_rows_kernel(O* out, cuda::device_acc_t<T>* lse, double* row_loss, int64_t* status, const T* x,
                               const I* target, RowParams p) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  using Team = RowTeam<kBlock>;
  for (int64_t r = Team::first(); r < p.rows; r += Team::step()) {
    const int64_t t = int64_t(target[r]);
    if (skip_row<T, O>(t, r, p, lse, row_loss, out, status, Team::lane() == 0)) continue;
    const T* xr = x + r * p.c;
    RowState<A> st = empty_state<A>();
    for (int64_t i = Team::lane(); i < p.c; i += Team::width()) add_value(st, C::load(xr[i]));
    st = Team::reduce(st);
    if (Team::lane() == 0) finish_row<T, O>(st, C::load(xr[t]), r, p, lse, row_loss, out);
  }
}

// D > 1: one thread per (n, d) row, walking its C logits with stride D.
template <typename T, typename I, typename O>
__global__ void ce_strided_kernel(O* out, cuda::device_acc_t<T>* lse, double* row_loss, int64_t* status, const T* x,
                                  const I* target, RowParams p) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < p.rows; r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = int64_t(target[r]);
    if (skip_row<T, O>(t, r, p, lse, row_loss, out, status, true)) continue;
    const T* xr = x + (r / p.d) * p.c * p.d + r % p.d;
    RowState<A> st = empty_state<A>();
    for (int64_t i = 0; i < p.c; ++i) add_value(st, C::load(xr[i * p.d]));
    finish_row<T, O>(st, C::load(xr[t * p.d]), r, p, lse, row_loss, out);
  }
}

// One block: the count of non-ignored targets into status[0] and, unless Reduction::None,
// the sum (or mean) of the row losses into out[0]. Fixed per-thread order, fixed tree.
template <typename T, typename I, typename O>
__global__ void ce_total_kernel(O* out, int64_t* status, const double* row_loss, const I* target, int64_t rows,
                                int64_t ignore_index, int reduction) {
  using A = cuda::device_acc_t<T>;
  __shared__ double part[kSumThreads];
  __shared__ int64_t part_count[kSumThreads];
  double s = 0.0;
  int64_t n = 0;
  for (int64_t r = threadIdx.x; r < rows; r += kSumThreads) {
    s += row_loss[r];
    n += int64_t(target[r]) != ignore_index ? 1 : 0;
  }
  part[threadIdx.x] = s;
  part_count[threadIdx.x] = n;
  __syncthreads();
  for (int half = kSumThreads / 2; half > 0; half >>= 1) {
    if (int(threadIdx.x) < half) {
      part[threadIdx.x] += part[threadIdx.x + half];
      part_count[threadIdx.x] += part_count[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const int64_t count = part_count[0];
    status[0] = count;
    if (reduction == int(Reduction::Mean)) out[0] = store_loss<T, O>(A(part[0] / double(count)));
    else if (reduction == int(Reduction::Sum)) out[0] = store_loss<T, O>(A(part[0]));
  }
}

// grad_logits, one thread per element.
template <typename T, typename I>
__global__ void ce_backward_kernel(T* grad, const T* x, const I* target, const cuda::device_acc_t<T>* lse,
                                   const cuda::device_acc_t<T>* grad_loss, int64_t total, int64_t c, int64_t d,
                                   int64_t ignore_index, cuda::device_acc_t<T> off_target,
                                   cuda::device_acc_t<T> on_target, int reduction, int64_t count) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = e / (c * d), k = (e / d) % c, r = n * d + e % d;
    const int64_t t = int64_t(target[r]);
    A v = A(0);
    if (t != ignore_index) {
      const A coef = reduction == int(Reduction::None)   ? grad_loss[r]
                     : reduction == int(Reduction::Mean) ? A(double(grad_loss[0]) / double(count))
                                                         : grad_loss[0];
      v = coef * (d_exp(C::load(x[e]) - lse[r]) - off_target);
      if (k == t) v -= coef * on_target;
    }
    grad[e] = C::store(v);
  }
}

// fn(type_tag<T>, type_tag<I>) for floating logits and i32/i64 targets.
template <typename F>
void visit_types(DType logits, DType target, const char* op, F&& fn) {
  cuda::visit_device_type(logits, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (cuda::is_device_float_v<T>) {
      if (target == DType::i64) fn(tag, type_tag<int64_t>{});
      else if (target == DType::i32) fn(tag, type_tag<int32_t>{});
      else EMBER_FAIL(op, ": target must hold class indices (int32 or int64), got ", dtype_name(target));
    } else {
      EMBER_FAIL(op, ": logits must be floating point, got ", dtype_name(logits));
    }
  });
}

int64_t cross_entropy_cuda(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                           const CrossEntropyArgs& args) {
  cuda::DeviceGuard guard(loss.device(), "cross_entropy");
  const int64_t n = logits.size(0), c = logits.size(1), d = logits.size(2), rows = n * d;
  const cudaStream_t stream = cuda::current_stream();
  const Tensor status = empty({kStatusWords}, {DType::i64, loss.device()});
  const Tensor row_loss = empty({rows > 0 ? rows : 1}, {DType::f64, loss.device()});
  int64_t* ps = static_cast<int64_t*>(status.raw_data());
  double* pl = static_cast<double*>(row_loss.raw_data());
  EMBER_CUDA_CHECK(cudaMemsetAsync(ps, 0, sizeof(int64_t) * kStatusWords, stream));
  const RowParams p{rows, c, d, args.ignore_index, args.label_smoothing, args.reduction == Reduction::None};
  visit_types(logits.dtype(), target.dtype(), "cross_entropy", [&](auto tag, auto itag) {
    using T = typename decltype(tag)::type;
    using I = typename decltype(itag)::type;
    using A = cuda::device_acc_t<T>;
    const T* px = static_cast<const T*>(logits.raw_data());
    const I* pt = static_cast<const I*>(target.raw_data());
    A* plse = static_cast<A*>(lse.raw_data());
    auto run = [&](auto otag) {
      using O = typename decltype(otag)::type;
      O* po = static_cast<O*>(loss.raw_data());
      if (rows > 0) {
        if (d == 1 && c <= kWarpRowMax) {
          ce_rows_kernel<T, I, O, false><<<cuda::grid_for(rows * kWarp, kThreads), kThreads, 0, stream>>>(
              po, plse, pl, ps, px, pt, p);
        } else if (d == 1) {
          ce_rows_kernel<T, I, O, true><<<cuda::grid_for(rows * kRowThreads, kRowThreads), kRowThreads, 0, stream>>>(
              po, plse, pl, ps, px, pt, p);
        } else {
          ce_strided_kernel<T, I, O><<<cuda::grid_for(rows, kThreads), kThreads, 0, stream>>>(po, plse, pl, ps, px,
                                                                                           pt, p);
        }
        EMBER_CUDA_CHECK_LAUNCH();
      }
      ce_total_kernel<T, I, O><<<1, kSumThreads, 0, stream>>>(po, ps, pl, pt, rows, args.ignore_index,
                                                             int(args.reduction));
      EMBER_CUDA_CHECK_LAUNCH();
    };
    if (loss.dtype() == logits.dtype()) run(type_tag<T>{});
    else run(type_tag<A>{});
  });
  int64_t host[kStatusWords] = {};
  EMBER_CUDA_CHECK(cudaMemcpyAsync(host, ps, sizeof(host), cudaMemcpyDeviceToHost, stream));
  EMBER_CUDA_CHECK(cudaStreamSynchronize(stream));
  EMBER_CHECK(host[1] == 0, "cross_entropy: target ", host[2], " is out of bounds for ", c,
              " classes (valid range [0, ", c, "), or ignore_index ", args.ignore_index, ")");
  return host[0];
}

void cross_entropy_backward_cuda(const Tensor& grad_logits, const Tensor& grad_loss, const Tensor& logits,
                                 const Tensor& target, const Tensor& lse, const CrossEntropyArgs& args,
                                 int64_t count) {
  cuda::DeviceGuard guard(grad_logits.device(), "cross_entropy_backward");
  const int64_t c = logits.size(1), d = logits.size(2), total = logits.numel();
  if (total == 0) return;
  const cudaStream_t stream = cuda::current_stream();
  visit_types(logits.dtype(), target.dtype(), "cross_entropy_backward", [&](auto tag, auto itag) {
    using T = typename decltype(tag)::type;
    using I = typename decltype(itag)::type;
    using A = cuda::device_acc_t<T>;
    const A eps = A(args.label_smoothing);
    ce_backward_kernel<T, I><<<cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(grad_logits.raw_data()), static_cast<const T*>(logits.raw_data()),
        static_cast<const I*>(target.raw_data()), static_cast<const A*>(lse.raw_data()),
        static_cast<const A*>(grad_loss.raw_data()), total, c, d, args.ignore_index, eps / A(c), A(1) - eps,
        int(args.reduction), count);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::cross_entropy_stub, CUDA, &cross_entropy_cuda);
EMBER_REGISTER_KERNEL(native::cross_entropy_backward_stub, CUDA, &cross_entropy_backward_cuda);

}  // namespace ember
