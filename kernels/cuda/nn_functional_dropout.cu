// CUDA dropout and its backward (core/native/nn_functional.h), semantics as
// kernels/cpu/nn_functional_dropout.cpp. Element e keeps when word e % 4 of the Philox block at counter
// state.offset + e / 4 is >= the threshold, so each thread draws one Philox block and decides
// the four elements it covers: the mask is the CPU's bit for bit, and no word is drawn twice.
// When every pointer is aligned to a group of four elements the thread moves them with one
// vector load and store (the mask as one 4-byte word); the last partial group, and unaligned
// views, go element by element. 16-bit types compute in float, f64 in double; the output is a
// product x * (keep ? scale : 0), so NaN and inf stay visible as on the CPU.
#include <cstdint>

#include "core/native/nn_functional.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/philox.cuh"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember {
namespace {

constexpr int kThreads = 256;

template <typename T> struct alignas(4 * sizeof(T)) Group4 {
  T v[4];
};
struct alignas(4) Keep4 {
  uint8_t v[4];
};

template <typename T>
bool aligned_to(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T)) == 0;
}

// Thread k handles elements 4k .. 4k + 3 (those below n) with Philox block offset + k.
template <typename T>
__global__ void dropout_kernel(T* out, uint8_t* mask, const T* x, int64_t n, uint64_t seed, uint64_t offset,
                               uint32_t threshold, cuda::device_acc_t<T> scale, bool vec) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  const int64_t groups = (n + 3) / 4;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < groups; k += int64_t(gridDim.x) * blockDim.x) {
    const uint4 r = cuda::philox(seed, offset + uint64_t(k));
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
    const int64_t first = 4 * k;
    if (vec && first + 4 <= n) {
      Group4<T> in = reinterpret_cast<const Group4<T>*>(x)[k];
      Group4<T> o;
      Keep4 m;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const bool keep = (w[j] >> 8) >= threshold;
        m.v[j] = keep ? 1 : 0;
        o.v[j] = C::store(C::load(in.v[j]) * (keep ? scale : A(0)));
      }
      reinterpret_cast<Group4<T>*>(out)[k] = o;
      reinterpret_cast<Keep4*>(mask)[k] = m;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t e = first + j;
        if (e < n) {
          const bool keep = (w[j] >> 8) >= threshold;
          mask[e] = keep ? 1 : 0;
          out[e] = C::store(C::load(x[e]) * (keep ? scale : A(0)));
        }
      }
    }
  }
}

// grad_in = grad_out * (mask ? scale : 0), four elements per thread.
template <typename T>
__global__ void dropout_backward_kernel(T* gi, const T* go, const uint8_t* mask, int64_t n,
                                        cuda::device_acc_t<T> scale, bool vec) {
  using A = cuda::device_acc_t<T>;
  using C = cuda::Acc<T>;
  const int64_t groups = (n + 3) / 4;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < groups; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t first = 4 * k;
    if (vec && first + 4 <= n) {
      const Group4<T> g = reinterpret_cast<const Group4<T>*>(go)[k];
      const Keep4 m = reinterpret_cast<const Keep4*>(mask)[k];
      Group4<T> o;
#pragma unroll
      for (int j = 0; j < 4; ++j) o.v[j] = C::store(C::load(g.v[j]) * (m.v[j] ? scale : A(0)));
      reinterpret_cast<Group4<T>*>(gi)[k] = o;
    } else {
      for (int64_t e = first; e < first + 4 && e < n; ++e) gi[e] = C::store(C::load(go[e]) * (mask[e] ? scale : A(0)));
    }
  }
}

void dropout_cuda(const Tensor& out, const Tensor& mask, const Tensor& x, double p, double scale, GeneratorState st) {
  cuda::DeviceGuard guard(out.device(), "dropout");
  const int64_t n = x.numel();
  if (n == 0) return;
  const uint32_t threshold = cuda::dropout_threshold(p);
  const cudaStream_t stream = cuda::current_stream();
  cuda::visit_device_floating(x.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = cuda::device_acc_t<T>;
    T* po = static_cast<T*>(out.raw_data());
    uint8_t* pm = static_cast<uint8_t*>(mask.raw_data());
    const T* px = static_cast<const T*>(x.raw_data());
    const bool vec = aligned_to<T>(po) && aligned_to<T>(px) && reinterpret_cast<uintptr_t>(pm) % 4 == 0;
    dropout_kernel<T><<<cuda::grid_for((n + 3) / 4, kThreads), kThreads, 0, stream>>>(
        po, pm, px, n, st.seed, st.offset, threshold, A(scale), vec);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

void dropout_backward_cuda(const Tensor& grad_in, const Tensor& grad_out, const Tensor& mask, double scale) {
  cuda::DeviceGuard guard(grad_in.device(), "dropout_backward");
  const int64_t n = grad_out.numel();
  if (n == 0) return;
  const cudaStream_t stream = cuda::current_stream();
  cuda::visit_device_floating(grad_out.dtype(), "dropout_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = cuda::device_acc_t<T>;
    T* pi = static_cast<T*>(grad_in.raw_data());
    const T* pg = static_cast<const T*>(grad_out.raw_data());
    const uint8_t* pm = static_cast<const uint8_t*>(mask.raw_data());
    const bool vec = aligned_to<T>(pi) && aligned_to<T>(pg) && reinterpret_cast<uintptr_t>(pm) % 4 == 0;
    dropout_backward_kernel<T><<<cuda::grid_for((n + 3) / 4, kThreads), kThreads, 0, stream>>>(pi, pg, pm, n,
                                                                                               A(scale), vec);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::dropout_stub, CUDA, &dropout_cuda);
EMBER_REGISTER_KERNEL(native::dropout_backward_stub, CUDA, &dropout_backward_cuda);

}  // namespace ember
