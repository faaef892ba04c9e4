// CUDA copy (strided, broadcasting, converting between every pair of dtypes), fill, and
// copies between host and device. Conversions follow kernels/cpu/copy.cpp exactly: floats
// reach 16-bit types through float, integers convert directly, bool is "!= 0".
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

#include "core/half.h"
#include "core/native/copy.h"
#include "core/type_dispatch.h"
#include "core/tensor_impl.h"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/pinned_allocator.h"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember {
namespace {

constexpr int kThreads = 256;

// ---- same dtype: move raw words of the element's width

template <typename Word>
__global__ void copy_words_kernel(Word* dst, const Word* src, cuda::StridedIndexer<2> ix, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[2];
    ix.offsets(i, off);
    dst[off[0]] = src[off[1]];
  }
}

template <typename Word>
__global__ void fill_words_kernel(Word* dst, Word value, cuda::StridedIndexer<1> ix, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[1];
    ix.offsets(i, off);
    dst[off[0]] = value;
  }
}

// ---- converting copy: read any dtype into a Value, write it as To

struct Value {
  double f;    // floating sources
  int64_t i;   // integer and bool sources
  bool is_float;
};

__device__ __forceinline__ Value load_value(const void* base, DType dt, int64_t off) {
  switch (dt) {
    case DType::f32: return {double(static_cast<const float*>(base)[off]), 0, true};
    case DType::f64: return {static_cast<const double*>(base)[off], 0, true};
    case DType::f16: return {double(__half2float(static_cast<const __half*>(base)[off])), 0, true};
    case DType::bf16:
      return {double(__bfloat162float(static_cast<const __nv_bfloat16*>(base)[off])), 0, true};
    case DType::i32: return {0.0, static_cast<const int32_t*>(base)[off], false};
    case DType::i64: return {0.0, static_cast<const int64_t*>(base)[off], false};
    default: return {0.0, static_cast<const bool*>(base)[off] ? 1 : 0, false};
  }
}

// Floats and doubles narrow straight from the source value, as static_cast does on the CPU.
__device__ __forceinline__ float as_float(const Value& v) { return v.is_float ? float(v.f) : float(v.i); }

template <typename To> __device__ __forceinline__ To store_value(const Value& v);
template <> __device__ __forceinline__ float store_value<float>(const Value& v) { return as_float(v); }
template <> __device__ __forceinline__ double store_value<double>(const Value& v) {
  return v.is_float ? v.f : double(v.i);
}
template <> __device__ __forceinline__ __half store_value<__half>(const Value& v) {
  return __float2half_rn(as_float(v));
}
template <> __device__ __forceinline__ __nv_bfloat16 store_value<__nv_bfloat16>(const Value& v) {
  return __float2bfloat16_rn(as_float(v));
}
template <> __device__ __forceinline__ int32_t store_value<int32_t>(const Value& v) {
  return v.is_float ? int32_t(v.f) : int32_t(v.i);
}
template <> __device__ __forceinline__ int64_t store_value<int64_t>(const Value& v) {
  return v.is_float ? int64_t(v.f) : v.i;
}
template <> __device__ __forceinline__ bool store_value<bool>(const Value& v) {
  return v.is_float ? v.f != 0.0 : v.i != 0;
}

template <typename To>
__global__ void convert_kernel(To* dst, const void* src, DType src_dtype, cuda::StridedIndexer<2> ix, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t off[2];
    ix.offsets(i, off);
    dst[off[0]] = store_value<To>(load_value(src, src_dtype, off[1]));
  }
}

// ---- host side

template <typename F>
void visit_word(size_t width, F&& fn) {
  switch (width) {
    case 1: return fn(type_tag<uint8_t>{});
    case 2: return fn(type_tag<uint16_t>{});
    case 4: return fn(type_tag<uint32_t>{});
    default: return fn(type_tag<uint64_t>{});
  }
}

void copy_cuda(const Tensor& dst, const Tensor& src) {
  cuda::DeviceGuard guard(dst.device(), "copy_");
  EMBER_CHECK(src.device() == dst.device(), "copy_: source on ", src.device(), " and destination on ",
              dst.device(), " must share a device here");
  const cudaStream_t stream = cuda::current_stream();
  if (dst.dtype() == src.dtype() && dst.shape() == src.shape() && dst.is_contiguous() && src.is_contiguous()) {
    EMBER_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), size_t(dst.numel()) * dst.element_size(),
                                     cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const Tensor from = native::expand(src, dst.shape());
  cuda::for_each_indexable<2>(dst.shape(), {dst, from}, [&](const cuda::StridedIndexer<2>& ix, int64_t n,
                                                             const std::array<Tensor, 2>& ops) {
    const unsigned blocks = cuda::grid_for(n, kThreads);
    if (ops[0].dtype() == ops[1].dtype()) {
      visit_word(ops[0].element_size(), [&](auto tag) {
        using W = typename decltype(tag)::type;
        copy_words_kernel<W><<<blocks, kThreads, 0, stream>>>(static_cast<W*>(ops[0].raw_data()),
                                                              static_cast<const W*>(ops[1].raw_data()), ix, n);
      });
    } else {
      cuda::visit_device_type(ops[0].dtype(), "copy_", [&](auto tag) {
        using To = typename decltype(tag)::type;
        convert_kernel<To><<<blocks, kThreads, 0, stream>>>(static_cast<To*>(ops[0].raw_data()),
                                                            ops[1].raw_data(), ops[1].dtype(), ix, n);
      });
    }
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

// The bit pattern of `value` in `dtype`, converted on the host exactly as the CPU fill does.
uint64_t fill_pattern(DType dtype, double value) {
  uint64_t bits = 0;
  auto put = [&](auto v) { std::memcpy(&bits, &v, sizeof(v)); };
  switch (dtype) {
    case DType::f32: put(float(value)); break;
    case DType::f64: put(value); break;
    case DType::f16: put(Half(float(value)).bits); break;
    case DType::bf16: put(BFloat16(float(value)).bits); break;
    case DType::i32: put(int32_t(value)); break;
    case DType::i64: put(int64_t(value)); break;
    case DType::boolean: put(uint8_t(value != 0.0 ? 1 : 0)); break;
  }
  return bits;
}

void fill_cuda(const Tensor& dst, double value) {
  cuda::DeviceGuard guard(dst.device(), "fill_");
  const cudaStream_t stream = cuda::current_stream();
  const uint64_t bits = fill_pattern(dst.dtype(), value);
  if (bits == 0 && dst.is_contiguous()) {
    EMBER_CUDA_CHECK(cudaMemsetAsync(dst.raw_data(), 0, size_t(dst.numel()) * dst.element_size(), stream));
    return;
  }
  cuda::for_each_indexable<1>(dst.shape(), {dst}, [&](const cuda::StridedIndexer<1>& ix, int64_t n,
                                                      const std::array<Tensor, 1>& ops) {
    visit_word(ops[0].element_size(), [&](auto tag) {
      using W = typename decltype(tag)::type;
      W word;
      std::memcpy(&word, &bits, sizeof(W));  // little-endian: the low bytes hold the value
      fill_words_kernel<W><<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(
          static_cast<W*>(ops[0].raw_data()), word, ix, n);
    });
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

// Host <-> device and device <-> device across GPUs; both contiguous, same shape and dtype.
void cross_device_copy_cuda(const Tensor& dst, const Tensor& src, bool non_blocking) {
  EMBER_CHECK(dst.dtype() == src.dtype() && dst.shape() == src.shape() && dst.is_contiguous() &&
                  src.is_contiguous(),
              "copy_ (between devices): expected contiguous tensors of one shape and dtype, got ",
              src.shape(), " ", dtype_name(src.dtype()), " and ", dst.shape(), " ", dtype_name(dst.dtype()));
  const Device gpu = dst.is_cuda() ? dst.device() : src.device();
  cuda::DeviceGuard guard(gpu, "copy_ (between devices)");
  if (src.is_cuda()) cuda::check_device(src.device(), "copy_ (between devices)");
  const size_t nbytes = size_t(dst.numel()) * dst.element_size();
  const cudaStream_t stream = cuda::current_stream();
  if (dst.is_cuda() && src.is_cuda()) {
    EMBER_CUDA_CHECK(cudaMemcpyPeerAsync(dst.raw_data(), dst.device().index, src.raw_data(),
                                         src.device().index, nbytes, stream));
  } else {
    const cudaMemcpyKind kind = dst.is_cuda() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    EMBER_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), nbytes, kind, stream));
  }
  // A pinned host block must outlive the queued copy: the pinned pool keeps it from reuse until
  // the stream has passed this point. (Pageable memory is staged by the driver before
  // cudaMemcpyAsync returns, and a device-to-pageable copy completes before it returns.)
  for (const Tensor* host : {&dst, &src}) {
    if (native::is_pinned(*host)) cuda::pinned_host_allocator().record_use(host->impl()->storage->data(), stream);
  }
  // Unless asked not to, the host side may be read or freed as soon as we return.
  if (!non_blocking) EMBER_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace

EMBER_REGISTER_KERNEL(native::copy_stub, CUDA, &copy_cuda);
EMBER_REGISTER_KERNEL(native::fill_stub, CUDA, &fill_cuda);
EMBER_REGISTER_KERNEL(native::cross_device_copy_stub, CUDA, &cross_device_copy_cuda);

}  // namespace ember
