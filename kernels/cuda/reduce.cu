// CUDA reductions on the stubs of core/native/reduce.h: sum, mean, amax, amin, argmax, argmin
// and var over the [outer, reduced, inner] geometry. Semantics match kernels/cpu/reduce.cpp:
// floating sums accumulate in double, integer and bool sums in int64; amax/amin return NaN
// when a NaN is reduced; argmax/argmin return the first index of the extreme, the first NaN
// counting as the extreme; var is two-pass (mean, then squared deviations), both in double,
// divided by max(0, reduced - correction). An empty reduction gives 0 (sum) or NaN (mean, var):
// the identity of the sum divided by a zero count.
//
// Each reduction is an Ops value (init, fold one element, combine two partial results, store)
// run by one of two drivers:
//  - inner == 1: every output is a contiguous row, reduced by one warp (rows up to
//    kWarpRowMax) or one block (longer rows), lanes striding the row so loads coalesce, partial
//    results joined by warp shuffles (through shared memory across the warps of a block).
//  - inner > 1: every thread owns one output column and walks down it in order; neighbouring
//    threads own neighbouring columns, so each step of the walk is one coalesced load. Very
//    short rows (inner == 1, at most kThreadRowMax elements) also take this path, one thread a
//    row, rather than leaving most lanes of a warp idle.
// When there are few outputs and the reduced dim is long, the reduced dim is cut into nsplit
// fixed chunks (a function of the shape only): the first pass writes one partial result per
// (chunk, output) to a scratch tensor, the second combines them in chunk order. There are no
// atomics, so results are identical from run to run.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/native/reduce.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/row_reduce.cuh"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember {
namespace {

using native::ReduceGeometry;
using native::ReduceKind;

using cuda::kWarp;
constexpr int kThreads = 256;            // every kernel; warp-per-row kernels take 8 rows a block
constexpr int64_t kThreadRowMax = 16;    // rows up to this long go to one thread each
using cuda::kWarpRowMax;                 // longer rows (or row chunks) get a whole block
constexpr int64_t kRowSplitBelow = 512;  // fewer rows than this: long rows are split...
constexpr int64_t kRowChunk = 8192;      // ...into chunks of at least this many elements
constexpr int64_t kColSplitBelow = 65536;  // fewer columns than this: long columns are split...
constexpr int64_t kColChunk = 64;          // ...into chunks of at least this many rows...
constexpr int64_t kColTarget = 131072;     // ...until about this many threads have work
constexpr int64_t kMaxSplit = 1024;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename V> __device__ __forceinline__ bool is_nan(V v) {
  if constexpr (std::is_floating_point_v<V>) return v != v;
  else return false;
}

// The smallest and largest values of V (infinities for floating types).
template <typename V> __device__ __forceinline__ V lowest_value() {
  if constexpr (std::is_floating_point_v<V>) return -std::numeric_limits<V>::infinity();
  else return std::numeric_limits<V>::lowest();
}
template <typename V> __device__ __forceinline__ V highest_value() {
  if constexpr (std::is_floating_point_v<V>) return std::numeric_limits<V>::infinity();
  else return std::numeric_limits<V>::max();
}

// A double result stored as O; 16-bit types go through float, as store_as does on the CPU.
template <typename O> __device__ __forceinline__ O store_double(double v) {
  if constexpr (std::is_same_v<O, __half>) return __float2half_rn(float(v));
  else if constexpr (std::is_same_v<O, __nv_bfloat16>) return __float2bfloat16_rn(float(v));
  else return static_cast<O>(v);
}

template <typename V> struct ArgAcc {
  V value;
  int64_t index;
};

template <typename A> __device__ __forceinline__ A shfl_down(A v, int offset) {
  if constexpr (std::is_same_v<A, bool>) return __shfl_down_sync(0xffffffffu, int(v), offset) != 0;
  else return __shfl_down_sync(0xffffffffu, v, offset);
}
template <typename V> __device__ __forceinline__ ArgAcc<V> shfl_down(ArgAcc<V> v, int offset) {
  return {shfl_down(v.value, offset), shfl_down(v.index, offset)};
}

// Lane 0 ends up with the combination of the warp's 32 values.
template <typename Ops, typename A> __device__ __forceinline__ A warp_reduce(const Ops& ops, A v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) v = ops.combine(v, shfl_down(v, offset));
  return v;
}

// ---- the reductions

// sum and mean: S is double for floating T, int64 otherwise; O is the output type.
template <typename T, typename S, typename O>
struct SumOps {
  using Acc = S;
  using Ctx = int;
  O* out;
  int64_t len;
  bool mean;
  __device__ __forceinline__ Acc init() const { return S(0); }
  __device__ __forceinline__ Ctx context(int64_t) const { return 0; }
  __device__ __forceinline__ Acc fold(Acc a, T x, int64_t, Ctx) const { return a + S(cuda::Acc<T>::load(x)); }
  __device__ __forceinline__ Acc combine(Acc a, Acc b) const { return a + b; }
  __device__ __forceinline__ void store(int64_t j, Acc a) const {
    if constexpr (std::is_same_v<S, double>) out[j] = store_double<O>(mean ? a / double(len) : a);
    else out[j] = O(a);
  }
};

// amax and amin: NaN wins.
template <typename T, bool IsMax>
struct ExtremeOps {
  using V = cuda::device_acc_t<T>;
  using Acc = V;
  using Ctx = int;
  T* out;
  __device__ __forceinline__ Acc init() const { return IsMax ? lowest_value<V>() : highest_value<V>(); }
  __device__ __forceinline__ Ctx context(int64_t) const { return 0; }
  __device__ __forceinline__ Acc combine(Acc a, Acc b) const {
    if (is_nan(a) || is_nan(b)) return is_nan(a) ? a : b;
    return (IsMax ? b > a : b < a) ? b : a;
  }
  __device__ __forceinline__ Acc fold(Acc a, T x, int64_t, Ctx) const { return combine(a, cuda::Acc<T>::load(x)); }
  __device__ __forceinline__ void store(int64_t j, Acc a) const { out[j] = cuda::Acc<T>::store(a); }
};

// argmax and argmin. combine picks by a total order (NaN first, then the extreme value, then
// the smaller index), so the result does not depend on how the elements were grouped: the
// first NaN if there is one, else the first position of the extreme. The identity carries an
// index no element has, so it loses every tie.
template <typename T, bool IsMax>
struct ArgOps {
  using V = cuda::device_acc_t<T>;
  using Acc = ArgAcc<V>;
  using Ctx = int;
  int64_t* out;
  __device__ __forceinline__ Acc init() const {
    return {IsMax ? lowest_value<V>() : highest_value<V>(), std::numeric_limits<int64_t>::max()};
  }
  __device__ __forceinline__ Ctx context(int64_t) const { return 0; }
  __device__ __forceinline__ Acc combine(Acc a, Acc b) const {
    const bool an = is_nan(a.value), bn = is_nan(b.value);
    if (an || bn) {
      if (an && bn) return b.index < a.index ? b : a;
      return an ? a : b;
    }
    if (IsMax ? b.value > a.value : b.value < a.value) return b;
    if (b.value == a.value && b.index < a.index) return b;
    return a;
  }
  __device__ __forceinline__ Acc fold(Acc a, T x, int64_t r, Ctx) const {
    return combine(a, Acc{cuda::Acc<T>::load(x), r});
  }
  __device__ __forceinline__ void store(int64_t j, Acc a) const { out[j] = a.index; }
};

// var's second pass: the sum of squared deviations from the first pass's means, over dof.
template <typename T>
struct SquaredDevOps {
  using Acc = double;
  using Ctx = double;
  T* out;
  const double* means;
  double dof;
  __device__ __forceinline__ Acc init() const { return 0.0; }
  __device__ __forceinline__ Ctx context(int64_t j) const { return means[j]; }
  __device__ __forceinline__ Acc fold(Acc a, T x, int64_t, Ctx m) const {
    const double d = double(cuda::Acc<T>::load(x)) - m;
    return a + d * d;
  }
  __device__ __forceinline__ Acc combine(Acc a, Acc b) const { return a + b; }
  __device__ __forceinline__ void store(int64_t j, Acc a) const { out[j] = store_double<T>(a / dof); }
};

// ---- drivers

// The threads that share one row chunk: a warp, or the whole block. Lane 0 gets the result.
template <bool kBlock> struct RowTeam;

template <> struct RowTeam<false> : cuda::RowSlots<false> {
  template <typename Ops, typename A> static __device__ __forceinline__ A reduce(const Ops& ops, A v) {
    return warp_reduce(ops, v);
  }
};

template <> struct RowTeam<true> : cuda::RowSlots<true> {
  template <typename Ops, typename A> static __device__ __forceinline__ A reduce(const Ops& ops, A v) {
    // raw storage: A need not be default-constructible in shared memory
    __shared__ alignas(16) unsigned char raw[kWarp * sizeof(A)];
    A* partial = reinterpret_cast<A*>(raw);
    const int lane_in_warp = int(threadIdx.x % kWarp), warp = int(threadIdx.x / kWarp);
    const int warps = int(blockDim.x / kWarp);
    v = warp_reduce(ops, v);
    __syncthreads();  // the previous reduction's readers are done with `partial`
    if (lane_in_warp == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
      v = lane_in_warp < warps ? partial[lane_in_warp] : ops.init();
      v = warp_reduce(ops, v);
    }
    return v;
  }
};

// inner == 1. Task t is chunk t % nsplit of row t / nsplit, elements [c * chunk, (c + 1) * chunk).
// With nsplit == 1 the result is stored; otherwise it goes to partial[c * rows + row].
template <typename Ops, typename T, bool kBlock>
__global__ void reduce_rows_kernel(Ops ops, const T* x, int64_t rows, int64_t len, int64_t nsplit, int64_t chunk,
                                   typename Ops::Acc* partial) {
  using Acc = typename Ops::Acc;
  using Team = RowTeam<kBlock>;
  const int64_t tasks = rows * nsplit;
  for (int64_t t = Team::first(); t < tasks; t += Team::step()) {
    const int64_t j = t / nsplit, c = t % nsplit;
    const int64_t begin = c * chunk, end = begin + chunk < len ? begin + chunk : len;
    const T* row = x + j * len;
    const typename Ops::Ctx ctx = ops.context(j);
    Acc a = ops.init();
    for (int64_t r = begin + Team::lane(); r < end; r += Team::width()) a = ops.fold(a, row[r], r, ctx);
    a = Team::reduce(ops, a);
    if (Team::lane() == 0) {
      if (nsplit == 1) ops.store(j, a);
      else partial[c * rows + j] = a;
    }
  }
}

// inner > 1. Task t is chunk t / n of column j = t % n (n = outer * inner outputs); the thread
// walks rows [c * chunk, (c + 1) * chunk) of that column in order.
template <typename Ops, typename T>
__global__ void reduce_cols_kernel(Ops ops, const T* x, int64_t outer, int64_t len, int64_t inner, int64_t nsplit,
                                   int64_t chunk, typename Ops::Acc* partial) {
  using Acc = typename Ops::Acc;
  const int64_t n = outer * inner, tasks = n * nsplit;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < tasks; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = t / n, j = t - c * n;
    const int64_t o = j / inner, i = j - o * inner;
    const int64_t begin = c * chunk, end = begin + chunk < len ? begin + chunk : len;
    const T* col = x + o * len * inner + i;
    const typename Ops::Ctx ctx = ops.context(j);
    Acc a = ops.init();
    for (int64_t r = begin; r < end; ++r) a = ops.fold(a, col[r * inner], r, ctx);
    if (nsplit == 1) ops.store(j, a);
    else partial[c * n + j] = a;
  }
}

// Second pass: output j combines partial[c * n + j] for c = 0 .. nsplit-1, in order.
template <typename Ops>
__global__ void reduce_finish_kernel(Ops ops, const typename Ops::Acc* partial, int64_t n, int64_t nsplit) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < n; j += int64_t(gridDim.x) * blockDim.x) {
    typename Ops::Acc a = partial[j];
    for (int64_t c = 1; c < nsplit; ++c) a = ops.combine(a, partial[c * n + j]);
    ops.store(j, a);
  }
}

// How many chunks the reduced dim is cut into: a function of the geometry only.
int64_t split_count(const ReduceGeometry& g) {
  const int64_t len = g.reduced, n = g.outer * g.inner;
  int64_t nsplit = 1;
  if (g.inner == 1) {
    if (g.outer < kRowSplitBelow && len >= 2 * kRowChunk) nsplit = std::min(len / kRowChunk, kMaxSplit);
  } else if (n < kColSplitBelow && len >= 2 * kColChunk) {
    nsplit = std::min({len / kColChunk, ceil_div(kColTarget, n), kMaxSplit});
  }
  return std::max<int64_t>(nsplit, 1);
}

template <typename T, typename Ops>
void run_reduction(const Ops& ops, const ReduceGeometry& g, Device device) {
  using Acc = typename Ops::Acc;
  const int64_t n = g.outer * g.inner, len = g.reduced;
  if (n == 0) return;
  const T* x = static_cast<const T*>(g.src.raw_data());
  const cudaStream_t stream = cuda::current_stream();
  int64_t nsplit = split_count(g);
  const int64_t chunk = nsplit > 1 ? ceil_div(len, nsplit) : len;
  if (nsplit > 1) nsplit = ceil_div(len, chunk);  // no empty trailing chunk
  Tensor scratch;  // freed in stream order: later work on this stream may reuse it safely
  Acc* partial = nullptr;
  if (nsplit > 1) {
    const int64_t words = ceil_div(nsplit * n * int64_t(sizeof(Acc)), 8);
    scratch = make_tensor({words}, DType::i64, device);
    partial = reinterpret_cast<Acc*>(scratch.raw_data());
  }
  const int64_t tasks = n * nsplit;
  if (g.inner == 1 && len > kThreadRowMax) {
    if (chunk <= kWarpRowMax) {
      reduce_rows_kernel<Ops, T, false><<<cuda::grid_for(tasks * kWarp, kThreads), kThreads, 0, stream>>>(
          ops, x, n, len, nsplit, chunk, partial);
    } else {
      reduce_rows_kernel<Ops, T, true><<<cuda::grid_for(tasks * kThreads, kThreads), kThreads, 0, stream>>>(
          ops, x, n, len, nsplit, chunk, partial);
    }
  } else {
    reduce_cols_kernel<Ops, T><<<cuda::grid_for(tasks, kThreads), kThreads, 0, stream>>>(
        ops, x, g.outer, len, g.inner, nsplit, chunk, partial);
  }
  EMBER_CUDA_CHECK_LAUNCH();
  if (nsplit > 1) {
    reduce_finish_kernel<Ops><<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(ops, partial, n, nsplit);
    EMBER_CUDA_CHECK_LAUNCH();
  }
}

const char* kind_name(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::sum: return "sum";
    case ReduceKind::mean: return "mean";
    case ReduceKind::amax: return "amax";
    case ReduceKind::amin: return "amin";
  }
  return "reduce";
}

template <typename T>
void run_sum(const Tensor& out, const ReduceGeometry& g, bool mean, const char* op) {
  if constexpr (std::is_floating_point_v<cuda::device_acc_t<T>>) {
    EMBER_CHECK(out.dtype() == g.src.dtype(), op, ": output dtype ", dtype_name(out.dtype()),
                " differs from the input's ", dtype_name(g.src.dtype()));
    run_reduction<T>(SumOps<T, double, T>{static_cast<T*>(out.raw_data()), g.reduced, mean}, g, out.device());
  } else {
    EMBER_CHECK(!mean, op, ": expected a floating-point tensor, got ", dtype_name(g.src.dtype()));
    EMBER_CHECK(out.dtype() == DType::i64, op, ": integer and bool sums are written as int64, got an output of ",
                dtype_name(out.dtype()));
    run_reduction<T>(SumOps<T, int64_t, int64_t>{static_cast<int64_t*>(out.raw_data()), g.reduced, false}, g,
                     out.device());
  }
}

void check_out(const Tensor& out, const ReduceGeometry& g, DType dtype, const char* op) {
  EMBER_CHECK(out.is_contiguous() && out.numel() == g.outer * g.inner && out.dtype() == dtype, op,
              ": expected a contiguous ", dtype_name(dtype), " output of ", g.outer * g.inner, " elements, got ",
              dtype_name(out.dtype()), " of shape ", out.shape());
}

void reduce_cuda(const Tensor& out, const ReduceGeometry& g, ReduceKind kind) {
  const char* op = kind_name(kind);
  cuda::DeviceGuard guard(out.device(), op);
  EMBER_CHECK(out.is_contiguous() && out.numel() == g.outer * g.inner, op, ": expected a contiguous output of ",
              g.outer * g.inner, " elements, got shape ", out.shape());
  cuda::visit_device_type(g.src.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    switch (kind) {
      case ReduceKind::sum: run_sum<T>(out, g, false, op); break;
      case ReduceKind::mean: run_sum<T>(out, g, true, op); break;
      case ReduceKind::amax:
        check_out(out, g, g.src.dtype(), op);
        run_reduction<T>(ExtremeOps<T, true>{static_cast<T*>(out.raw_data())}, g, out.device());
        break;
      case ReduceKind::amin:
        check_out(out, g, g.src.dtype(), op);
        run_reduction<T>(ExtremeOps<T, false>{static_cast<T*>(out.raw_data())}, g, out.device());
        break;
    }
  });
}

void arg_reduce_cuda(const Tensor& out, const ReduceGeometry& g, bool is_max) {
  const char* op = is_max ? "argmax" : "argmin";
  cuda::DeviceGuard guard(out.device(), op);
  check_out(out, g, DType::i64, op);
  EMBER_CHECK(g.reduced > 0 || g.outer * g.inner == 0, op, ": cannot reduce over a dim of size 0");
  cuda::visit_device_type(g.src.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    int64_t* o = static_cast<int64_t*>(out.raw_data());
    if (is_max) run_reduction<T>(ArgOps<T, true>{o}, g, out.device());
    else run_reduction<T>(ArgOps<T, false>{o}, g, out.device());
  });
}

void var_cuda(const Tensor& out, const ReduceGeometry& g, int64_t correction) {
  cuda::DeviceGuard guard(out.device(), "var");
  check_out(out, g, g.src.dtype(), "var");
  const int64_t n = g.outer * g.inner;
  if (n == 0) return;
  cuda::visit_device_type(g.src.dtype(), "var", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<cuda::device_acc_t<T>>) {
      const Tensor means = make_tensor({n}, DType::f64, out.device());
      double* m = static_cast<double*>(means.raw_data());
      run_reduction<T>(SumOps<T, double, double>{m, g.reduced, true}, g, out.device());
      const double dof = double(std::max<int64_t>(0, g.reduced - correction));
      run_reduction<T>(SquaredDevOps<T>{static_cast<T*>(out.raw_data()), m, dof}, g, out.device());
    } else {
      EMBER_FAIL("var: expected a floating-point tensor, got ", dtype_name(g.src.dtype()));
    }
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::reduce_stub, CUDA, &reduce_cuda);
EMBER_REGISTER_KERNEL(native::arg_reduce_stub, CUDA, &arg_reduce_cuda);
EMBER_REGISTER_KERNEL(native::var_stub, CUDA, &var_cuda);

}  // namespace ember
