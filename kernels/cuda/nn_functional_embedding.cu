// CUDA embedding lookup and its backward, with the semantics of kernels/cpu/nn_functional_embedding.cpp.
//
// Forward: a flat grid-stride copy of output words, each word taken from the row its index
// names; words are 16 bytes when the row length and both pointers allow (8, 4, 2 or 1
// otherwise), so consecutive threads read and write consecutive 16-byte pieces of a row.
//
// Backward: a CUB radix sort of the keys (index << pbits | position) groups the positions by
// row, in position order within a row. Each run of equal rows is cut into chunks of
// kEmbeddingChunk positions from its start; one thread per (chunk, column) sums that column of
// the chunk's gradient rows in position order, in the accumulation type. A run of one chunk is
// stored at once, so up to kEmbeddingChunk uses of a row the result is the CPU's bit for bit;
// a longer run (every token-type id 0, say: one run of batch * length positions) is spread
// over many threads and a finishing pass adds its chunk sums in chunk order. No atomics touch
// data and the chunks are fixed, so results never vary between runs. Rows not indexed and the
// padding row keep the zeros they start with.
//
// Index values are checked on the device first (smallest bad position via an integer
// atomicMin, read back with one stream synchronisation) and reported as the CPU does.
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "core/factory.h"
#include "core/native/nn_functional.h"
#include "core/type_dispatch.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/dtype_io.cuh"
#include "kernels/cuda/index_support.cuh"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kEmbeddingChunk = 64;  // backward: sorted positions summed by one thread

// word copies, bad-index reporting and key sorting (index_support.cuh)
using namespace cuda;

// ---- index check

// Throws the CPU's message for the first index outside [0, num_embeddings).
void check_embedding_indices(const Tensor& indices, int64_t num_embeddings) {
  check_indices(indices, num_embeddings, "embedding", [&](int64_t v, int64_t pos) {
    EMBER_FAIL("embedding: index ", v, " at position ", pos, " is out of range for ", num_embeddings,
               " embeddings (valid range [0, ", num_embeddings, "))");
  });
}

// ---- forward

template <typename W, typename I>
__global__ void embedding_kernel(W* out, const W* weight, const I* idx, int64_t total, int64_t row_words) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = t / row_words, c = t - k * row_words;
    out[t] = weight[int64_t(idx[k]) * row_words + c];
  }
}

void embedding_cuda(const Tensor& out, const Tensor& weight, const Tensor& indices) {
  cuda::DeviceGuard guard(out.device(), "embedding");
  const cudaStream_t stream = cuda::current_stream();
  const int64_t num = weight.size(0), n = indices.numel();
  check_embedding_indices(indices, num);
  const int64_t row_bytes = weight.size(1) * int64_t(weight.element_size());
  if (row_bytes == 0 || n == 0) return;
  const size_t w = word_width({uint64_t(row_bytes), address(out.raw_data()), address(weight.raw_data())});
  const int64_t row_words = row_bytes / int64_t(w);
  const int64_t total = n * row_words;
  visit_word(w, [&](auto wtag) {
    using W = typename decltype(wtag)::type;
    visit_index(indices.dtype(), "embedding", [&](auto itag) {
      using I = typename decltype(itag)::type;
      embedding_kernel<W, I><<<cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(
          static_cast<W*>(out.raw_data()), static_cast<const W*>(weight.raw_data()),
          static_cast<const I*>(indices.raw_data()), total, row_words);
      EMBER_CUDA_CHECK_LAUNCH();
    });
  });
}

// ---- backward

// Sorted position k belongs to the run of equal rows starting at run_start[k] (the first key of
// that row: keys are unique and sorted, so a binary search finds it).
__global__ void run_starts_kernel(int64_t* run_start, const uint64_t* keys, int64_t n, int pbits) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t first_key = (keys[k] >> pbits) << pbits;
    int64_t lo = 0, hi = k;  // the answer lies in [lo, hi]
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (keys[mid] < first_key) lo = mid + 1;
      else hi = mid;
    }
    run_start[k] = lo;
  }
}

// Partial sums of a run are kept per block of kEmbeddingChunk sorted positions: a run's first
// chunk in slot 1 of the block it starts in, each later chunk in slot 0 of its block. A block
// holds at most one of each (a run with a second chunk is longer than a block, so no other
// such run starts in that block, and only the run holding the block's first position can
// reach it from before).
__device__ __forceinline__ int64_t chunk_slot(int64_t k, bool first_chunk) {
  return 2 * (k / kEmbeddingChunk) + (first_chunk ? 1 : 0);
}

// One thread per (k, d) of [n, dim] where sorted position k starts a chunk of its run (every
// kEmbeddingChunk positions from the run's start): it sums column d of the chunk's gradient
// rows in position order. A run that is one chunk is stored in grad_weight at once; the
// chunks of a longer run go to `partial` for the finishing pass.
template <typename T>
__global__ void embedding_backward_chunks_kernel(T* grad_weight, cuda::device_acc_t<T>* partial, const T* grad,
                                                 const uint64_t* keys, const int64_t* run_start, int64_t n,
                                                 int64_t dim, int pbits, int64_t padding_idx) {
  using C = cuda::Acc<T>;
  using A = cuda::device_acc_t<T>;
  const uint64_t mask = (uint64_t(1) << pbits) - 1;
  const int64_t total = n * dim;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = t / dim, d = t - k * dim;
    const int64_t start = run_start[k];
    if ((k - start) % kEmbeddingChunk != 0) continue;
    const uint64_t row = keys[k] >> pbits;
    if (int64_t(row) == padding_idx) continue;
    const int64_t end = k + kEmbeddingChunk < n ? k + kEmbeddingChunk : n;
    A acc = A(0);
    int64_t kk = k;
    for (; kk < end; ++kk) {
      const uint64_t key = keys[kk];
      if ((key >> pbits) != row) break;
      acc += C::load(grad[int64_t(key & mask) * dim + d]);
    }
    const bool first = k == start;
    const bool more = kk == k + kEmbeddingChunk && kk < n && (keys[kk] >> pbits) == row;
    if (first && !more) grad_weight[int64_t(row) * dim + d] = C::store(acc);
    else partial[chunk_slot(k, first) * dim + d] = acc;
  }
}

// One thread per (k, d) where k starts a run longer than one chunk: adds the run's chunk sums
// in chunk order and stores column d of its row.
template <typename T>
__global__ void embedding_backward_finish_kernel(T* grad_weight, const cuda::device_acc_t<T>* partial,
                                                 const uint64_t* keys, const int64_t* run_start, int64_t n,
                                                 int64_t dim, int pbits, int64_t padding_idx) {
  using C = cuda::Acc<T>;
  using A = cuda::device_acc_t<T>;
  const int64_t total = n * dim;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = t / dim, d = t - k * dim;
    if (run_start[k] != k || k + kEmbeddingChunk >= n) continue;
    const uint64_t row = keys[k] >> pbits;
    if ((keys[k + kEmbeddingChunk] >> pbits) != row || int64_t(row) == padding_idx) continue;
    A acc = partial[chunk_slot(k, true) * dim + d];
    for (int64_t c = k + kEmbeddingChunk; c < n && (keys[c] >> pbits) == row; c += kEmbeddingChunk)
      acc += partial[chunk_slot(c, false) * dim + d];
    grad_weight[int64_t(row) * dim + d] = C::store(acc);
  }
}

void embedding_backward_cuda(const Tensor& grad_weight, const Tensor& grad, const Tensor& indices,
                             int64_t padding_idx) {
  cuda::DeviceGuard guard(grad_weight.device(), "embedding_backward");
  const cudaStream_t stream = cuda::current_stream();
  const int64_t num = grad_weight.size(0), dim = grad_weight.size(1), n = indices.numel();
  check_embedding_indices(indices, num);
  if (n == 0 || dim == 0) return;
  const int pbits = bits_of(uint64_t(n - 1));
  const int bits = pbits + bits_of(uint64_t(num - 1));
  EMBER_CHECK(bits <= 64, "embedding_backward: ", n, " indices into ", num, " embeddings are too many to sort");
  const Tensor sorted = sort_row_keys(indices, grad_weight.device(), pbits, bits, "embedding_backward", stream);
  const uint64_t* keys_out = static_cast<const uint64_t*>(sorted.raw_data());
  // Freed at return while the kernels may still read them: reused only on this stream.
  const Tensor starts = empty({n}, {DType::i64, grad_weight.device()});
  int64_t* run_start = static_cast<int64_t*>(starts.raw_data());
  run_starts_kernel<<<cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(run_start, keys_out, n, pbits);
  EMBER_CUDA_CHECK_LAUNCH();
  const int64_t total = n * dim;
  const int64_t slots = 2 * ((n + kEmbeddingChunk - 1) / kEmbeddingChunk);
  cuda::visit_device_type(grad_weight.dtype(), "embedding_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = cuda::device_acc_t<T>;
    if constexpr (is_device_float_v<T>) {
      const Tensor partial = empty({slots * dim}, {dtype_of<A>::value, grad_weight.device()});
      A* pp = static_cast<A*>(partial.raw_data());
      T* gw = static_cast<T*>(grad_weight.raw_data());
      const T* g = static_cast<const T*>(grad.raw_data());
      embedding_backward_chunks_kernel<T><<<cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(
          gw, pp, g, keys_out, run_start, n, dim, pbits, padding_idx);
      EMBER_CUDA_CHECK_LAUNCH();
      if (n > kEmbeddingChunk) {  // only then can a run have a second chunk
        embedding_backward_finish_kernel<T><<<cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(
            gw, pp, keys_out, run_start, n, dim, pbits, padding_idx);
        EMBER_CUDA_CHECK_LAUNCH();
      }
    } else {
      EMBER_FAIL("embedding_backward: expected a floating-point tensor, got ", dtype_name(grad_weight.dtype()));
    }
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::embedding_stub, CUDA, &embedding_cuda);
EMBER_REGISTER_KERNEL(native::embedding_backward_stub, CUDA, &embedding_backward_cuda);

}  // namespace ember
