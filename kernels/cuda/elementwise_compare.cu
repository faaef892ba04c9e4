// CUDA kernels of the selecting elementwise ops: comparisons (tensor-tensor and tensor-scalar,
// giving bool), where and masked_fill, on the stubs of core/native/elementwise.h. Semantics
// match kernels/cpu/elementwise_binary.cpp: tensors compare in their compute type (float for
// 16-bit types); against a scalar, floating tensors compare with the scalar rounded to their
// own dtype first (so x == 0.1 holds where x was set from 0.1) and integer and bool tensors
// compare exactly in double; where and masked_fill copy elements bit for bit.
// Operands are broadcast to the output's shape with native::expand and walked by the strided
// indexer (division-free for contiguous operands), one element per thread and step of a
// grid-stride loop.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/half.h"
#include "core/native/elementwise.h"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember {
namespace {

using native::CompareOp;
constexpr int kThreads = 256;

template <typename A>
__device__ __forceinline__ bool apply_compare(CompareOp op, A x, A y) {
  switch (op) {
    case CompareOp::Eq: return x == y;
    case CompareOp::Ne: return x != y;
    case CompareOp::Lt: return x < y;
    case CompareOp::Le: return x <= y;
    case CompareOp::Gt: return x > y;
    case CompareOp::Ge: return x >= y;
  }
  return false;
}

// The value of element x as the comparison sees it (A: the compute type or double).
template <typename A, typename T> __device__ __forceinline__ A compare_value(T x) {
  return A(cuda::Acc<T>::load(x));
}

// Operands 0, 1, 2 of the indexer are out, a, b; b == nullptr compares against the scalar s.
template <typename T, typename A>
__global__ void compare_kernel(CompareOp op, bool* out, const T* a, const T* b, A s, cuda::StridedIndexer<3> ix,
                               int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[3];
    ix.offsets(i, off);
    const A y = b ? compare_value<A>(b[off[2]]) : s;
    out[off[0]] = apply_compare<A>(op, compare_value<A>(a[off[1]]), y);
  }
}

// Operands: out, cond, a, b.
template <typename T>
__global__ void where_kernel(T* out, const bool* cond, const T* a, const T* b, cuda::StridedIndexer<4> ix, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[4];
    ix.offsets(i, off);
    out[off[0]] = cond[off[1]] ? a[off[2]] : b[off[3]];
  }
}

// Operands: out, x, mask.
template <typename T>
__global__ void masked_fill_kernel(T* out, const T* x, const bool* mask, T value, cuda::StridedIndexer<3> ix,
                                   int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[3];
    ix.offsets(i, off);
    out[off[0]] = mask[off[2]] ? value : x[off[1]];
  }
}

template <typename T> constexpr bool is_device_floating_v = std::is_floating_point_v<cuda::device_acc_t<T>>;

// `v` rounded to device type T on the host, by the same conversions as the CPU kernels (16-bit
// types through float, with ember's round-to-nearest-even; bool as v != 0).
template <typename T> T host_value(double v) {
  if constexpr (std::is_same_v<T, __half>) {
    const uint16_t bits = Half(float(v)).bits;
    T out;
    std::memcpy(&out, &bits, sizeof(out));
    return out;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const uint16_t bits = BFloat16(float(v)).bits;
    T out;
    std::memcpy(&out, &bits, sizeof(out));
    return out;
  } else if constexpr (std::is_same_v<T, bool>) {
    return v != 0.0;
  } else {
    return T(v);
  }
}

// The scalar of a tensor-scalar comparison in the type the comparison runs in.
template <typename T> auto compare_scalar_value(double s) {
  if constexpr (std::is_same_v<T, __half>) return float(Half(float(s)));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return float(BFloat16(float(s)));
  else if constexpr (std::is_same_v<T, float>) return float(s);
  else return s;  // double tensors, and integers and bools, which compare exactly in double
}

// `b` undefined: compare against the scalar s.
template <typename T>
void run_compare(CompareOp op, const Tensor& out, const Tensor& a, const Tensor& b, double s) {
  using A = std::conditional_t<is_device_floating_v<T>, cuda::device_acc_t<T>, double>;
  // tensor-tensor comparisons of integers and bools stay in their own type
  using TT = cuda::device_acc_t<T>;
  const cudaStream_t stream = cuda::current_stream();
  const Tensor ax = native::expand(a, out.shape());
  const Tensor bx = b.defined() ? native::expand(b, out.shape()) : out;
  cuda::for_each_indexable<3>(out.shape(), {out, ax, bx}, [&](const cuda::StridedIndexer<3>& ix, int64_t n,
                                                             const std::array<Tensor, 3>& ops) {
    bool* po = static_cast<bool*>(ops[0].raw_data());
    const T* pa = static_cast<const T*>(ops[1].raw_data());
    if (b.defined()) {
      compare_kernel<T, TT><<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(
          op, po, pa, static_cast<const T*>(ops[2].raw_data()), TT(0), ix, n);
    } else {
      compare_kernel<T, A><<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(
          op, po, pa, nullptr, A(compare_scalar_value<T>(s)), ix, n);
    }
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

void check_compare(const Tensor& out, const Tensor& a, const Tensor& b, CompareOp op) {
  EMBER_CHECK(out.dtype() == DType::boolean, native::op_name(op), ": expected a bool output, got ",
              dtype_name(out.dtype()));
  EMBER_CHECK(!b.defined() || a.dtype() == b.dtype(), native::op_name(op), ": operands differ in dtype (",
              dtype_name(a.dtype()), " and ", dtype_name(b.dtype()), ")");
}

void compare_cuda(CompareOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  cuda::DeviceGuard guard(out.device(), native::op_name(op));
  check_compare(out, a, b, op);
  if (out.numel() == 0) return;
  cuda::visit_device_type(a.dtype(), native::op_name(op), [&](auto tag) {
    run_compare<typename decltype(tag)::type>(op, out, a, b, 0.0);
  });
}

void compare_scalar_cuda(CompareOp op, const Tensor& out, const Tensor& a, double s) {
  cuda::DeviceGuard guard(out.device(), native::op_name(op));
  check_compare(out, a, Tensor(), op);
  if (out.numel() == 0) return;
  cuda::visit_device_type(a.dtype(), native::op_name(op), [&](auto tag) {
    run_compare<typename decltype(tag)::type>(op, out, a, Tensor(), s);
  });
}

void where_cuda(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  cuda::DeviceGuard guard(out.device(), "where");
  EMBER_CHECK(cond.dtype() == DType::boolean, "where: expected a bool condition, got ", dtype_name(cond.dtype()));
  EMBER_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype(), "where: expected operands of the output's dtype ",
              dtype_name(out.dtype()), ", got ", dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
  if (out.numel() == 0) return;
  const Tensor cx = native::expand(cond, out.shape());
  const Tensor ax = native::expand(a, out.shape());
  const Tensor bx = native::expand(b, out.shape());
  const cudaStream_t stream = cuda::current_stream();
  cuda::visit_device_type(out.dtype(), "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda::for_each_indexable<4>(out.shape(), {out, cx, ax, bx}, [&](const cuda::StridedIndexer<4>& ix, int64_t n,
                                                                    const std::array<Tensor, 4>& ops) {
      where_kernel<T><<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(
          static_cast<T*>(ops[0].raw_data()), static_cast<const bool*>(ops[1].raw_data()),
          static_cast<const T*>(ops[2].raw_data()), static_cast<const T*>(ops[3].raw_data()), ix, n);
      EMBER_CUDA_CHECK_LAUNCH();
    });
  });
}

void masked_fill_cuda(const Tensor& out, const Tensor& x, const Tensor& mask, double value) {
  cuda::DeviceGuard guard(out.device(), "masked_fill");
  EMBER_CHECK(mask.dtype() == DType::boolean, "masked_fill: expected a bool mask, got ", dtype_name(mask.dtype()));
  EMBER_CHECK(x.dtype() == out.dtype() && x.shape() == out.shape(), "masked_fill: input ", dtype_name(x.dtype()),
              " of shape ", x.shape(), " does not match the output ", dtype_name(out.dtype()), " of shape ",
              out.shape());
  if (out.numel() == 0) return;
  const Tensor mx = native::expand(mask, out.shape());
  const cudaStream_t stream = cuda::current_stream();
  cuda::visit_device_type(out.dtype(), "masked_fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = host_value<T>(value);
    cuda::for_each_indexable<3>(out.shape(), {out, x, mx}, [&](const cuda::StridedIndexer<3>& ix, int64_t n,
                                                               const std::array<Tensor, 3>& ops) {
      masked_fill_kernel<T><<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(
          static_cast<T*>(ops[0].raw_data()), static_cast<const T*>(ops[1].raw_data()),
          static_cast<const bool*>(ops[2].raw_data()), v, ix, n);
      EMBER_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::compare_stub, CUDA, &compare_cuda);
EMBER_REGISTER_KERNEL(native::compare_scalar_stub, CUDA, &compare_scalar_cuda);
EMBER_REGISTER_KERNEL(native::where_stub, CUDA, &where_cuda);
EMBER_REGISTER_KERNEL(native::masked_fill_stub, CUDA, &masked_fill_cuda);

}  // namespace ember
