// CUDA kernels of the two-operand arithmetic ops (add, sub, mul, div, pow, maximum, minimum),
// tensor-tensor and tensor-scalar. Same-shape contiguous f32/f16/bf16 operands take the
// vectorised path: one 16-byte load per operand and one 16-byte store per thread and step of
// a grid-stride loop. Everything else (broadcast, strided, other dtypes) walks the strided
// indexer one element at a time. Arithmetic matches kernels/cpu/elementwise_binary.cpp:
// 16-bit types compute in float, maximum/minimum propagate NaN.
#include <cstdint>
#include <type_traits>

#include "core/native/elementwise.h"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember {
namespace {

using native::BinaryOp;
constexpr int kThreads = 256;

template <typename A>
__device__ __forceinline__ A apply_binary(BinaryOp op, A x, A y, A alpha) {
  constexpr bool floating = std::is_floating_point_v<A>;
  switch (op) {
    case BinaryOp::Add: return A(x + alpha * y);
    case BinaryOp::Sub: return A(x - alpha * y);
    case BinaryOp::Mul: return A(x * y);
    case BinaryOp::Maximum:
      if constexpr (floating) return (x != x || x > y) ? x : y;
      else return x > y ? x : y;
    case BinaryOp::Minimum:
      if constexpr (floating) return (x != x || x < y) ? x : y;
      else return x < y ? x : y;
    case BinaryOp::Div:
      if constexpr (floating) return x / y;
      break;
    case BinaryOp::Pow:
      if constexpr (std::is_same_v<A, float>) return powf(x, y);
      else if constexpr (std::is_same_v<A, double>) return pow(x, y);
      break;
  }
  return x;  // integer div/pow never get here: the host refuses them
}

// b == nullptr: the right operand is the scalar s.
template <typename T, BinaryOp OP>
__global__ void binary_vec_kernel(T* out, const T* a, const T* b, cuda::device_acc_t<T> s,
                                  cuda::device_acc_t<T> alpha, int64_t n) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  constexpr int V = 16 / sizeof(T);
  struct alignas(16) Pack { T v[V]; };
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  const int64_t nvec = n / V;
  for (int64_t k = first; k < nvec; k += step) {
    const Pack pa = reinterpret_cast<const Pack*>(a)[k];
    Pack pb;
    if (b) pb = reinterpret_cast<const Pack*>(b)[k];
    Pack po;
#pragma unroll
    for (int j = 0; j < V; ++j)
      po.v[j] = C::store(apply_binary<A>(OP, C::load(pa.v[j]), b ? C::load(pb.v[j]) : s, alpha));
    reinterpret_cast<Pack*>(out)[k] = po;
  }
  for (int64_t i = nvec * V + first; i < n; i += step)
    out[i] = C::store(apply_binary<A>(OP, C::load(a[i]), b ? C::load(b[i]) : s, alpha));
}

// Operands 0, 1, 2 of the indexer are out, a, b (b unused when b == nullptr).
template <typename T>
__global__ void binary_strided_kernel(BinaryOp op, T* out, const T* a, const T* b, cuda::device_acc_t<T> s,
                                      cuda::device_acc_t<T> alpha, cuda::StridedIndexer<3> ix, int64_t n) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[3];
    ix.offsets(i, off);
    out[off[0]] = C::store(apply_binary<A>(op, C::load(a[off[1]]), b ? C::load(b[off[2]]) : s, alpha));
  }
}

template <typename T>
constexpr bool vectorisable_v =
    std::is_same_v<T, float> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0; }

bool flat_same_shape(const Tensor& out, const Tensor& t) {
  return t.shape() == out.shape() && t.is_contiguous() && aligned16(t);
}

template <typename T, BinaryOp OP>
void launch_vec(T* out, const T* a, const T* b, cuda::device_acc_t<T> s, cuda::device_acc_t<T> alpha, int64_t n,
                cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  binary_vec_kernel<T, OP><<<cuda::grid_for((n + V - 1) / V, kThreads), kThreads, 0, stream>>>(
      out, a, b, s, alpha, n);
}

// `b` undefined: the right operand is the scalar s.
template <typename T>
void run_binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, double s, double alpha) {
  using A = cuda::device_acc_t<T>;
  if constexpr (!std::is_floating_point_v<A>) {
    EMBER_CHECK(op != BinaryOp::Div && op != BinaryOp::Pow, native::op_name(op), ": not supported for ",
                dtype_name(out.dtype()), " tensors");
  }
  const A sv = A(s), al = A(alpha);
  const cudaStream_t stream = cuda::current_stream();
  T* po = static_cast<T*>(out.raw_data());
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = b.defined() ? static_cast<const T*>(b.raw_data()) : nullptr;
  if constexpr (vectorisable_v<T>) {
    if (out.is_contiguous() && aligned16(out) && flat_same_shape(out, a) && (!b.defined() || flat_same_shape(out, b))) {
      const int64_t n = out.numel();
      switch (op) {
        case BinaryOp::Add: launch_vec<T, BinaryOp::Add>(po, pa, pb, sv, al, n, stream); break;
        case BinaryOp::Sub: launch_vec<T, BinaryOp::Sub>(po, pa, pb, sv, al, n, stream); break;
        case BinaryOp::Mul: launch_vec<T, BinaryOp::Mul>(po, pa, pb, sv, al, n, stream); break;
        case BinaryOp::Div: launch_vec<T, BinaryOp::Div>(po, pa, pb, sv, al, n, stream); break;
        case BinaryOp::Pow: launch_vec<T, BinaryOp::Pow>(po, pa, pb, sv, al, n, stream); break;
        case BinaryOp::Maximum: launch_vec<T, BinaryOp::Maximum>(po, pa, pb, sv, al, n, stream); break;
        case BinaryOp::Minimum: launch_vec<T, BinaryOp::Minimum>(po, pa, pb, sv, al, n, stream); break;
      }
      EMBER_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  const Tensor ax = native::expand(a, out.shape());
  const Tensor bx = b.defined() ? native::expand(b, out.shape()) : out;
  cuda::for_each_indexable<3>(out.shape(), {out, ax, bx}, [&](const cuda::StridedIndexer<3>& ix, int64_t n,
                                                             const std::array<Tensor, 3>& ops) {
    binary_strided_kernel<T><<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(
        op, static_cast<T*>(ops[0].raw_data()), static_cast<const T*>(ops[1].raw_data()),
        pb ? static_cast<const T*>(ops[2].raw_data()) : nullptr, sv, al, ix, n);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

void binary_cuda(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, double alpha) {
  cuda::DeviceGuard guard(out.device(), native::op_name(op));
  cuda::visit_device_type(out.dtype(), native::op_name(op), [&](auto tag) {
    run_binary<typename decltype(tag)::type>(op, out, a, b, 0.0, alpha);
  });
}

void binary_scalar_cuda(BinaryOp op, const Tensor& out, const Tensor& a, double s) {
  cuda::DeviceGuard guard(out.device(), native::op_name(op));
  cuda::visit_device_type(out.dtype(), native::op_name(op), [&](auto tag) {
    run_binary<typename decltype(tag)::type>(op, out, a, Tensor(), s, 1.0);
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::binary_stub, CUDA, &binary_cuda);
EMBER_REGISTER_KERNEL(native::binary_scalar_stub, CUDA, &binary_scalar_cuda);

}  // namespace ember
