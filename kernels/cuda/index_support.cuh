// Pieces shared by the CUDA kernels that move rows by index or accumulate into indexed
// destinations (indexing.cu, nn_functional_embedding.cu): word-width selection for raw copies, the
// device-side bad-index check (smallest bad position via an integer atomicMin into a one-word
// device tensor, read back with one stream synchronisation), and the CUB radix sort of 64-bit
// keys (destination << pbits | source position) that groups contributions by destination in
// source order without atomics on data.
#pragma once
// CUB's NVTX ranges would pull in dlopen of the NVTX injection library; not wanted here.
#ifndef CCCL_DISABLE_NVTX
#define CCCL_DISABLE_NVTX
#endif
#include <cub/device/device_radix_sort.cuh>

#include <bit>
#include <cstdint>
#include <initializer_list>

#include "core/factory.h"
#include "core/type_dispatch.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember::cuda {

constexpr int kIndexThreads = 256;
constexpr unsigned long long kNoBad = ~0ull;

// ---- raw word copies

// Calls fn with an unsigned word type of `width` bytes (uint4 for 16).
template <typename F>
void visit_word(size_t width, F&& fn) {
  switch (width) {
    case 16: return fn(type_tag<uint4>{});
    case 8: return fn(type_tag<uint64_t>{});
    case 4: return fn(type_tag<uint32_t>{});
    case 2: return fn(type_tag<uint16_t>{});
    default: return fn(type_tag<uint8_t>{});
  }
}

// The widest word (16, 8, 4, 2 or 1 bytes) dividing every quantity (byte counts, addresses).
inline size_t word_width(std::initializer_list<uint64_t> quantities) {
  for (uint64_t w : {16u, 8u, 4u, 2u}) {
    bool ok = true;
    for (uint64_t q : quantities) ok = ok && q % w == 0;
    if (ok) return size_t(w);
  }
  return 1;
}

inline uint64_t address(const void* p) { return uint64_t(reinterpret_cast<uintptr_t>(p)); }

// ---- bad-index reporting

template <typename I>
__device__ __forceinline__ bool out_of_range(I v, int64_t size) {
  return uint64_t(int64_t(v)) >= uint64_t(size);
}

__device__ __forceinline__ void note_bad(unsigned long long* first, int64_t pos) {
  atomicMin(first, static_cast<unsigned long long>(pos));
}

// One device word holding the smallest position of a bad index seen (kNoBad: none).
class BadIndex {
 public:
  BadIndex(Device device, cudaStream_t stream) : word_(empty({1}, {DType::i64, device})), stream_(stream) {
    EMBER_CUDA_CHECK(cudaMemsetAsync(word_.raw_data(), 0xff, sizeof(unsigned long long), stream_));
  }
  unsigned long long* ptr() const { return static_cast<unsigned long long*>(word_.raw_data()); }
  // Waits for the kernels queued so far; the first bad position, or -1.
  int64_t first() const {
    unsigned long long host = kNoBad;
    EMBER_CUDA_CHECK(cudaMemcpyAsync(&host, ptr(), sizeof(host), cudaMemcpyDeviceToHost, stream_));
    EMBER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return host == kNoBad ? -1 : int64_t(host);
  }

 private:
  Tensor word_;
  cudaStream_t stream_;
};

// The value of a contiguous int32/int64 index tensor at `pos` (read back for error messages).
inline int64_t index_value_at(const Tensor& index, int64_t pos, cudaStream_t stream) {
  return visit_index(index.dtype(), "index", [&](auto itag) -> int64_t {
    using I = typename decltype(itag)::type;
    I v{};
    EMBER_CUDA_CHECK(cudaMemcpyAsync(&v, static_cast<const I*>(index.raw_data()) + pos, sizeof(I),
                                     cudaMemcpyDeviceToHost, stream));
    EMBER_CUDA_CHECK(cudaStreamSynchronize(stream));
    return int64_t(v);
  });
}

template <typename I>
__global__ void find_bad_kernel(const I* idx, int64_t n, int64_t size, unsigned long long* first) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x)
    if (out_of_range(idx[t], size)) note_bad(first, t);
}

// Calls fail(value, position) for the first index outside [0, size); fail must throw.
template <typename Fail>
void check_indices(const Tensor& index, int64_t size, const char* op, Fail&& fail) {
  const int64_t n = index.numel();
  if (n == 0) return;
  const cudaStream_t stream = current_stream();
  const BadIndex bad(index.device(), stream);
  visit_index(index.dtype(), op, [&](auto itag) {
    using I = typename decltype(itag)::type;
    find_bad_kernel<I><<<grid_for(n, kIndexThreads), kIndexThreads, 0, stream>>>(
        static_cast<const I*>(index.raw_data()), n, size, bad.ptr());
    EMBER_CUDA_CHECK_LAUNCH();
  });
  const int64_t pos = bad.first();
  if (pos >= 0) fail(index_value_at(index, pos, stream), pos);
}

// ---- sorting keys

// Bits needed to write x (0 for 0).
inline int bits_of(uint64_t x) { return int(std::bit_width(x)); }

// keys[j] = index[j] << pbits | j
template <typename I>
__global__ void row_keys_kernel(uint64_t* keys, const I* idx, int64_t m, int pbits) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < m; j += int64_t(gridDim.x) * blockDim.x)
    keys[j] = (uint64_t(int64_t(idx[j])) << pbits) | uint64_t(j);
}

// The n keys ascending (all below 2^bits), in a fresh i64-sized tensor.
inline Tensor sort_keys(const Tensor& keys, int64_t n, int bits, cudaStream_t stream) {
  Tensor sorted = empty({n}, {DType::i64, keys.device()});
  const uint64_t* in = static_cast<const uint64_t*>(keys.raw_data());
  uint64_t* out = static_cast<uint64_t*>(sorted.raw_data());
  const int end_bit = bits < 1 ? 1 : bits;
  size_t temp_bytes = 0;
  EMBER_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, temp_bytes, in, out, n, 0, end_bit, stream));
  // Freed at return while the sort may still run: the allocator reuses it only on this stream.
  const Tensor temp = empty({int64_t(temp_bytes / 8) + 1}, {DType::i64, keys.device()});
  EMBER_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(temp.raw_data(), temp_bytes, in, out, n, 0, end_bit, stream));
  return sorted;
}

// The keys index[j] << pbits | j of a contiguous int32/int64 index, sorted (all below 2^bits),
// on `device`.
inline Tensor sort_row_keys(const Tensor& index, Device device, int pbits, int bits, const char* op,
                            cudaStream_t stream) {
  const int64_t m = index.numel();
  // Freed at return while the sort may still read it: the allocator reuses it only on this stream.
  const Tensor keys = empty({m}, {DType::i64, device});
  visit_index(index.dtype(), op, [&](auto itag) {
    using I = typename decltype(itag)::type;
    row_keys_kernel<I><<<grid_for(m, kIndexThreads), kIndexThreads, 0, stream>>>(
        static_cast<uint64_t*>(keys.raw_data()), static_cast<const I*>(index.raw_data()), m, pbits);
    EMBER_CUDA_CHECK_LAUNCH();
  });
  return sort_keys(keys, m, bits, stream);
}

}  // namespace ember::cuda
