// CUDA embedding lookup and its backward, with the semantics of kernels/cpu/embedding.cpp.
//
// Forward: a flat grid-stride copy of output words, each word taken from the row its index
// names; words are 16 bytes when the row length and both pointers allow (8, 4, 2 or 1
// otherwise), so consecutive threads read and write consecutive 16-byte pieces of a row.
//
// Backward: a CUB radix sort of the keys (index << pbits | position) groups the positions by
// row, in position order within a row. One thread per (sorted position, column) then checks
// whether its position starts a run of equal rows; if so it sums that column of the run's
// gradient rows in position order, in the accumulation type, and stores the sum once. No
// atomics touch data, so the result matches the CPU bit for bit and never varies between
// runs. Rows not indexed and the padding row keep the zeros they start with.
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

// One thread per (k, d) of [n, dim]: the thread whose sorted position k starts a run of equal
// rows writes column d of that row, the sum of the run's gradient rows in position order.
template <typename T>
__global__ void embedding_backward_kernel(T* grad_weight, const T* grad, const uint64_t* keys, int64_t n,
                                          int64_t dim, int pbits, int64_t padding_idx) {
  using C = cuda::Acc<T>;
  using A = cuda::device_acc_t<T>;
  const uint64_t mask = (uint64_t(1) << pbits) - 1;
  const int64_t total = n * dim;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = t / dim, d = t - k * dim;
    const uint64_t row = keys[k] >> pbits;
    if (k > 0 && (keys[k - 1] >> pbits) == row) continue;
    if (int64_t(row) == padding_idx) continue;
    A acc = A(0);
    for (int64_t kk = k; kk < n; ++kk) {
      const uint64_t key = keys[kk];
      if ((key >> pbits) != row) break;
      acc += C::load(grad[int64_t(key & mask) * dim + d]);
    }
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
  const int64_t total = n * dim;
  cuda::visit_device_type(grad_weight.dtype(), "embedding_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (is_device_float_v<T>) {
      embedding_backward_kernel<T><<<cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(
          static_cast<T*>(grad_weight.raw_data()), static_cast<const T*>(grad.raw_data()), keys_out, n, dim, pbits,
          padding_idx);
      EMBER_CUDA_CHECK_LAUNCH();
    } else {
      EMBER_FAIL("embedding_backward: expected a floating-point tensor, got ", dtype_name(grad_weight.dtype()));
    }
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::embedding_stub, CUDA, &embedding_cuda);
EMBER_REGISTER_KERNEL(native::embedding_backward_stub, CUDA, &embedding_backward_cuda);

}  // namespace ember
