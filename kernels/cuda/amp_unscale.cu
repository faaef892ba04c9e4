// CUDA loss unscaling: one pass that multiplies a gradient by 1/scale in place and raises the
// device-resident found_inf flag when a written value is inf or NaN. As on the CPU the check
// reads the exponent bits of the stored value, so a finite gradient that overflows its dtype on
// unscaling counts too. Contiguous f32/f16/bf16 gradients go 16 bytes per load; others walk
// the strided indexer. Each thread keeps its own verdict and writes the flag at most once; all
// writers store the same 1.0f, so no atomics are needed.
#include <cstdint>
#include <type_traits>

#include "core/native/amp.h"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ bool non_finite(float v) { return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u; }
__device__ __forceinline__ bool non_finite(double v) {
  return (static_cast<unsigned long long>(__double_as_longlong(v)) & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
}
__device__ __forceinline__ bool non_finite(__half v) { return (__half_as_ushort(v) & 0x7c00u) == 0x7c00u; }
__device__ __forceinline__ bool non_finite(__nv_bfloat16 v) { return (__bfloat16_as_ushort(v) & 0x7f80u) == 0x7f80u; }

template <typename T>
__device__ __forceinline__ T unscale_one(T g, cuda::device_acc_t<T> inv, bool& bad) {
  using C = cuda::Acc<T>;
  const T r = C::store(C::load(g) * inv);
  bad |= non_finite(r);
  return r;
}

template <typename T>
__global__ void unscale_vec_kernel(T* grad, float* found_inf, cuda::device_acc_t<T> inv, int64_t n) {
  constexpr int V = 16 / sizeof(T);
  struct alignas(16) Pack { T v[V]; };
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  const int64_t nvec = n / V;
  bool bad = false;
  for (int64_t k = first; k < nvec; k += step) {
    Pack p = reinterpret_cast<const Pack*>(grad)[k];
#pragma unroll
    for (int j = 0; j < V; ++j) p.v[j] = unscale_one(p.v[j], inv, bad);
    reinterpret_cast<Pack*>(grad)[k] = p;
  }
  for (int64_t i = nvec * V + first; i < n; i += step) grad[i] = unscale_one(grad[i], inv, bad);
  if (bad) *found_inf = 1.0f;
}

template <typename T>
__global__ void unscale_strided_kernel(T* grad, float* found_inf, cuda::device_acc_t<T> inv,
                                       cuda::StridedIndexer<1> ix, int64_t n) {
  bool bad = false;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[1];
    ix.offsets(i, off);
    grad[off[0]] = unscale_one(grad[off[0]], inv, bad);
  }
  if (bad) *found_inf = 1.0f;
}

template <typename T>
constexpr bool vectorisable_v =
    std::is_same_v<T, float> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

template <typename T>
void run_unscale(const Tensor& grad, float* flag, double inv_scale) {
  using A = cuda::device_acc_t<T>;
  const A inv = A(inv_scale);
  const cudaStream_t stream = cuda::current_stream();
  if constexpr (vectorisable_v<T>) {
    if (grad.is_contiguous() && reinterpret_cast<uintptr_t>(grad.raw_data()) % 16 == 0) {
      const int64_t n = grad.numel();
      constexpr int V = 16 / sizeof(T);
      unscale_vec_kernel<T><<<cuda::grid_for((n + V - 1) / V, kThreads), kThreads, 0, stream>>>(
          static_cast<T*>(grad.raw_data()), flag, inv, n);
      EMBER_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  cuda::for_each_indexable<1>(grad.shape(), {grad}, [&](const cuda::StridedIndexer<1>& ix, int64_t n,
                                                        const std::array<Tensor, 1>& ops) {
    unscale_strided_kernel<T><<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(ops[0].raw_data()), flag, inv, ix, n);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

void amp_unscale_cuda(const Tensor& grad, const Tensor& found_inf, double inv_scale) {
  cuda::DeviceGuard guard(grad.device(), "amp_unscale_");
  if (grad.numel() == 0) return;
  float* flag = static_cast<float*>(found_inf.raw_data());
  cuda::visit_device_type(grad.dtype(), "amp_unscale_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_integral_v<T>) {
      EMBER_FAIL("amp_unscale_: expected a floating-point gradient, got ", dtype_name(grad.dtype()), " of shape ",
                 grad.shape());
    } else {
      run_unscale<T>(grad, flag, inv_scale);
    }
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::amp_unscale_stub, CUDA, &amp_unscale_cuda);

}  // namespace ember
