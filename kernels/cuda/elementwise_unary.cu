// CUDA kernels of the one-operand elementwise ops and their fused backward
// (grad_in = grad_out * f'(x)). Contiguous f32/f16/bf16 tensors take the vectorised path: one
// 16-byte load per operand and one 16-byte store per thread and step of a grid-stride loop,
// with the element function fixed at compile time. Everything else walks the strided indexer.
// Semantics match kernels/cpu/elementwise_unary.cpp: 16-bit types compute in float, relu and
// clamp keep NaN, clamp with lower > upper gives upper, pow with exponent 1 or 2 takes a cheap
// form, integer tensors support neg, abs, relu and clamp (bounds rounded inwards).
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/native/elementwise.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/strided_indexer.cuh"
#include "kernels/shared/unary_fn.h"

namespace ember {
namespace {

using native::UnaryOp;
using native::UnaryParams;
constexpr int kThreads = 256;

// The element functions (pow with exponents 1 and 2 gets its own cheap form).
using Fn = kernels::UnaryFn;

__device__ __forceinline__ float d_fabs(float x) { return fabsf(x); }
__device__ __forceinline__ double d_fabs(double x) { return fabs(x); }

template <typename A> __device__ __forceinline__ A normal_cdf(A x) {
  return A(0.5) * d_erfc(-x * A(0.70710678118654752440));  // 1/sqrt(2)
}
template <typename A> __device__ __forceinline__ A gelu_tanh_of(A x) {
  return A(0.5) * x * (A(1) + d_tanh(A(0.79788456080286535588) * (x + A(0.044715) * x * x * x)));
}
template <typename A> __device__ __forceinline__ A gelu_tanh_grad(A x) {
  const A x2 = x * x;
  const A t = d_tanh(A(0.79788456080286535588) * x * (A(1) + A(0.044715) * x2));
  const A dinner = A(0.79788456080286535588) * (A(1) + A(3) * A(0.044715) * x2);
  return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * dinner;
}
// d/dx x sigmoid(x) = s (1 + x (1 - s)), s = sigmoid(x)
template <typename A> __device__ __forceinline__ A silu_grad(A x) {
  const A s = A(1) / (A(1) + d_exp(-x));
  return s * (A(1) + x * (A(1) - s));
}
// d/dx x Phi(x) = Phi(x) + x phi(x)
template <typename A> __device__ __forceinline__ A gelu_grad(A x) {
  return normal_cdf(x) + x * A(0.39894228040143267794) * d_exp(A(-0.5) * x * x);
}

// f(v); a and b are pow's exponent or clamp's bounds, a leaky_relu's slope. Integer types only ever get the first
// group (the host refuses the others).
template <typename A>
__device__ __forceinline__ A apply_forward(Fn f, A v, A a, A b) {
  switch (f) {
    case Fn::Neg: return A(-v);
    case Fn::Relu: return v < A(0) ? A(0) : v;  // NaN stays NaN
    case Fn::Identity: return v;
    case Fn::Square: return A(v * v);
    case Fn::Clamp: {
      const A t = v < a ? a : v;  // NaN stays NaN; a > b gives b
      return t > b ? b : t;
    }
    case Fn::Abs:
      if constexpr (std::is_floating_point_v<A>) return d_fabs(v);
      else return v < A(0) ? A(-v) : v;
    default: break;
  }
  if constexpr (std::is_floating_point_v<A>) {
    switch (f) {
      case Fn::Exp: return d_exp(v);
      case Fn::Log: return d_log(v);
      case Fn::Sqrt: return d_sqrt(v);
      case Fn::Rsqrt: return A(1) / d_sqrt(v);
      case Fn::Tanh: return d_tanh(v);
      case Fn::Sigmoid: return A(1) / (A(1) + d_exp(-v));
      case Fn::Gelu: return v * normal_cdf(v);
      case Fn::GeluTanh: return gelu_tanh_of(v);
      case Fn::Silu: return v / (A(1) + d_exp(-v));
      case Fn::Pow: return d_pow(v, a);
      case Fn::LeakyRelu: return v > A(0) ? v : v * a;  // NaN stays NaN
      default: break;
    }
  }
  return v;
}

// g * f'(x), where s is the saved output for Exp, Sqrt, Rsqrt, Tanh, Sigmoid and Relu and the
// input otherwise. Floating types only.
template <typename A>
__device__ __forceinline__ A apply_backward(Fn f, A g, A s, A a, A b) {
  switch (f) {
    case Fn::Neg: return -g;
    case Fn::Exp: return g * s;
    case Fn::Log: return g / s;
    case Fn::Sqrt: return g / (A(2) * s);
    case Fn::Rsqrt: return A(-0.5) * g * s * s * s;
    case Fn::Tanh: return g * (A(1) - s * s);
    case Fn::Sigmoid: return g * s * (A(1) - s);
    case Fn::Relu: return s > A(0) ? g : A(0);
    case Fn::Gelu: return g * gelu_grad(s);
    case Fn::GeluTanh: return g * gelu_tanh_grad(s);
    case Fn::Silu: return g * silu_grad(s);
    case Fn::Abs: return s > A(0) ? g : (s < A(0) ? -g : A(0));
    case Fn::Identity: return g;
    case Fn::Square: return A(2) * g * s;
    case Fn::Pow: return a == A(0) ? A(0) : g * a * d_pow(s, a - A(1));
    case Fn::Clamp: return (s >= a && s <= b) ? g : A(0);  // passes the gradient on the bounds too
    case Fn::LeakyRelu: return s > A(0) ? g : g * a;        // the slope at 0, as in PyTorch
  }
  return g;
}

template <typename T, Fn F>
__global__ void forward_vec_kernel(T* out, const T* x, cuda::device_acc_t<T> a, cuda::device_acc_t<T> b, int64_t n) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  constexpr int V = 16 / sizeof(T);
  struct alignas(16) Pack { T v[V]; };
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  const int64_t nvec = n / V;
  for (int64_t k = first; k < nvec; k += step) {
    const Pack px = reinterpret_cast<const Pack*>(x)[k];
    Pack po;
#pragma unroll
    for (int j = 0; j < V; ++j) po.v[j] = C::store(apply_forward<A>(F, C::load(px.v[j]), a, b));
    reinterpret_cast<Pack*>(out)[k] = po;
  }
  for (int64_t i = nvec * V + first; i < n; i += step) out[i] = C::store(apply_forward<A>(F, C::load(x[i]), a, b));
}

template <typename T, Fn F>
__global__ void backward_vec_kernel(T* gi, const T* go, const T* saved, cuda::device_acc_t<T> a,
                                    cuda::device_acc_t<T> b, int64_t n) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  constexpr int V = 16 / sizeof(T);
  struct alignas(16) Pack { T v[V]; };
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  const int64_t nvec = n / V;
  for (int64_t k = first; k < nvec; k += step) {
    const Pack pg = reinterpret_cast<const Pack*>(go)[k];
    const Pack ps = reinterpret_cast<const Pack*>(saved)[k];
    Pack po;
#pragma unroll
    for (int j = 0; j < V; ++j) po.v[j] = C::store(apply_backward<A>(F, C::load(pg.v[j]), C::load(ps.v[j]), a, b));
    reinterpret_cast<Pack*>(gi)[k] = po;
  }
  for (int64_t i = nvec * V + first; i < n; i += step)
    gi[i] = C::store(apply_backward<A>(F, C::load(go[i]), C::load(saved[i]), a, b));
}

// Operands 0, 1 of the indexer are out, x.
template <typename T>
__global__ void forward_strided_kernel(Fn f, T* out, const T* x, cuda::device_acc_t<T> a, cuda::device_acc_t<T> b,
                                       cuda::StridedIndexer<2> ix, int64_t n) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[2];
    ix.offsets(i, off);
    out[off[0]] = C::store(apply_forward<A>(f, C::load(x[off[1]]), a, b));
  }
}

// Operands 0, 1, 2 of the indexer are grad_in, grad_out, saved.
template <typename T>
__global__ void backward_strided_kernel(Fn f, T* gi, const T* go, const T* saved, cuda::device_acc_t<T> a,
                                        cuda::device_acc_t<T> b, cuda::StridedIndexer<3> ix, int64_t n) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[3];
    ix.offsets(i, off);
    gi[off[0]] = C::store(apply_backward<A>(f, C::load(go[off[1]]), C::load(saved[off[2]]), a, b));
  }
}

template <typename T>
constexpr bool vectorisable_v =
    std::is_same_v<T, float> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

bool flat(const Tensor& t) { return t.is_contiguous() && reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0; }

using kernels::int_lower_bound;
using kernels::int_upper_bound;

template <typename T>
void run_forward(Fn f, const Tensor& out, const Tensor& x, cuda::device_acc_t<T> a, cuda::device_acc_t<T> b) {
  const cudaStream_t stream = cuda::current_stream();
  if constexpr (vectorisable_v<T>) {
    if (flat(out) && flat(x)) {
      const int64_t n = out.numel();
      constexpr int V = 16 / sizeof(T);
      T* po = static_cast<T*>(out.raw_data());
      const T* px = static_cast<const T*>(x.raw_data());
      kernels::with_unary_fn(f, [&](auto fc) {
        forward_vec_kernel<T, decltype(fc)::value>
            <<<cuda::grid_for((n + V - 1) / V, kThreads), kThreads, 0, stream>>>(po, px, a, b, n);
      });
      EMBER_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  cuda::for_each_indexable<2>(out.shape(), {out, x}, [&](const cuda::StridedIndexer<2>& ix, int64_t n,
                                                         const std::array<Tensor, 2>& ops) {
    forward_strided_kernel<T><<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(
        f, static_cast<T*>(ops[0].raw_data()), static_cast<const T*>(ops[1].raw_data()), a, b, ix, n);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

template <typename T>
void run_backward(Fn f, const Tensor& gi, const Tensor& go, const Tensor& saved, cuda::device_acc_t<T> a,
                  cuda::device_acc_t<T> b) {
  const cudaStream_t stream = cuda::current_stream();
  if constexpr (vectorisable_v<T>) {
    if (flat(gi) && flat(go) && flat(saved)) {
      const int64_t n = gi.numel();
      constexpr int V = 16 / sizeof(T);
      T* pi = static_cast<T*>(gi.raw_data());
      const T* pg = static_cast<const T*>(go.raw_data());
      const T* ps = static_cast<const T*>(saved.raw_data());
      kernels::with_unary_fn(f, [&](auto fc) {
        backward_vec_kernel<T, decltype(fc)::value>
            <<<cuda::grid_for((n + V - 1) / V, kThreads), kThreads, 0, stream>>>(pi, pg, ps, a, b, n);
      });
      EMBER_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  cuda::for_each_indexable<3>(gi.shape(), {gi, go, saved}, [&](const cuda::StridedIndexer<3>& ix, int64_t n,
                                                               const std::array<Tensor, 3>& ops) {
    backward_strided_kernel<T><<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(
        f, static_cast<T*>(ops[0].raw_data()), static_cast<const T*>(ops[1].raw_data()),
        static_cast<const T*>(ops[2].raw_data()), a, b, ix, n);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

void unary_cuda(UnaryOp op, const Tensor& out, const Tensor& x, UnaryParams p) {
  const char* name = native::op_name(op);
  cuda::DeviceGuard guard(out.device(), name);
  if (out.numel() == 0) return;
  cuda::visit_device_type(out.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, bool>) {
      EMBER_FAIL(name, ": not supported for bool tensors");
    } else if constexpr (std::is_integral_v<T>) {
      switch (op) {
        case UnaryOp::Neg: return run_forward<T>(Fn::Neg, out, x, 0, 0);
        case UnaryOp::Abs: return run_forward<T>(Fn::Abs, out, x, 0, 0);
        case UnaryOp::Relu: return run_forward<T>(Fn::Relu, out, x, 0, 0);
        case UnaryOp::Clamp:
          return run_forward<T>(Fn::Clamp, out, x, int_lower_bound<T>(p.a), int_upper_bound<T>(p.b));
        default: EMBER_FAIL(name, ": not supported for ", dtype_name(out.dtype()), " tensors");
      }
    } else {
      using A = cuda::device_acc_t<T>;
      run_forward<T>(kernels::select_unary_fn(op, p), out, x, A(p.a), A(p.b));
    }
  });
}

void unary_backward_cuda(UnaryOp op, const Tensor& grad_in, const Tensor& grad_out, const Tensor& saved,
                         UnaryParams p) {
  const char* name = native::op_name(op);
  cuda::DeviceGuard guard(grad_in.device(), name);
  if (grad_in.numel() == 0) return;
  cuda::visit_device_type(grad_in.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_integral_v<T>) {
      EMBER_FAIL(name, " backward: expected a floating-point tensor, got ", dtype_name(grad_in.dtype()));
    } else {
      using A = cuda::device_acc_t<T>;
      run_backward<T>(kernels::select_unary_fn(op, p), grad_in, grad_out, saved, A(p.a), A(p.b));
    }
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::unary_stub, CUDA, &unary_cuda);
EMBER_REGISTER_KERNEL(native::unary_backward_stub, CUDA, &unary_backward_cuda);

}  // namespace ember
