// CUDA kernels for cat, index_select / index_add, gather / scatter_add and one_hot, with the
// semantics of kernels/cpu/indexing.cpp.
//
// Data movement (cat, index_select, gather) copies raw words: gather by element size, cat and
// index_select in the widest word (up to 16 bytes) that divides the rows they move and the
// alignment of both pointers. Every kernel is a flat grid-stride loop over output words.
//
// The accumulating kernels never use atomics on data. They radix-sort (CUB) 64-bit keys
// (destination << pbits | source position): equal destinations form runs ordered by source
// position, which for index_add and scatter_add is the CPU's index order. The thread at the
// first key of a run owns that destination and adds the run's sources one by one, rounding to
// the element type after each addition as the CPU does, so results match the CPU bit for bit
// and do not change from run to run. Cost: index_add sorts index.numel() keys once and starts
// one thread per source element (threads not at a run start return at once); scatter_add
// sorts index.numel() keys. A destination hit k times is summed serially by one thread.
//
// Index values are checked on the device: kernels record the smallest position of a bad index
// with an integer atomicMin into a one-word device tensor, which the host reads back (one
// stream synchronisation per call) before throwing the CPU's message for the first bad index.
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "core/factory.h"
#include "core/native/copy.h"
#include "core/native/indexing.h"
#include "core/native/views.h"
#include "core/type_dispatch.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/device_types.cuh"
#include "kernels/cuda/index_support.cuh"
#include "kernels/cuda/strided_indexer.cuh"

namespace ember {
namespace {

constexpr int kThreads = 256;

// word copies, bad-index reporting and key sorting (index_support.cuh)
using namespace cuda;

int64_t prod(const Shape& s, int64_t begin, int64_t end) {
  int64_t p = 1;
  for (int64_t k = begin; k < end; ++k) p *= s[size_t(k)];
  return p;
}

[[noreturn]] void fail_index(const char* op, int64_t index, int64_t dim, int64_t size) {
  EMBER_FAIL(op, ": index ", index, " is out of range for dim ", dim, " of size ", size, " (valid range [0, ",
             size, "))");
}

// acc + v in the accumulation type, rounded back to T (one CPU step T(A(acc) + A(v))).
template <typename T>
__device__ __forceinline__ T add_step(T acc, T v) {
  using C = cuda::Acc<T>;
  using A = cuda::device_acc_t<T>;
  return C::store(static_cast<A>(C::load(acc) + C::load(v)));
}

// ---- cat: each contiguous input is `rows` rows of row_words words, placed at a pitch in out

template <typename W>
__global__ void copy_rows_kernel(W* dst, const W* src, int64_t rows, int64_t row_words, int64_t dst_pitch) {
  const int64_t total = rows * row_words;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = t / row_words, c = t - r * row_words;
    dst[r * dst_pitch + c] = src[t];
  }
}

void cat_cuda(const Tensor& out, const std::vector<Tensor>& inputs, int64_t dim) {
  cuda::DeviceGuard guard(out.device(), "cat");
  const cudaStream_t stream = cuda::current_stream();
  const Shape& os = out.shape();
  const int64_t outer = prod(os, 0, dim);
  const int64_t inner = prod(os, dim + 1, out.dim());
  const int64_t es = int64_t(out.element_size());
  const int64_t out_row = os[size_t(dim)] * inner * es;  // bytes of one outer slice of out
  int64_t at = 0;                                         // position along `dim`
  for (const Tensor& t : inputs) {
    const int64_t len = t.size(dim);
    const int64_t bytes = len * inner * es;  // per outer slice
    if (bytes > 0 && outer > 0) {
      if (t.is_contiguous()) {
        char* dst = static_cast<char*>(out.raw_data()) + at * inner * es;
        const char* src = static_cast<const char*>(t.raw_data());
        const size_t w = word_width({uint64_t(bytes), uint64_t(out_row), address(dst), address(src)});
        visit_word(w, [&](auto wtag) {
          using W = typename decltype(wtag)::type;
          const int64_t row_words = bytes / int64_t(w);
          copy_rows_kernel<W><<<cuda::grid_for(outer * row_words, kThreads), kThreads, 0, stream>>>(
              reinterpret_cast<W*>(dst), reinterpret_cast<const W*>(src), outer, row_words, out_row / int64_t(w));
          EMBER_CUDA_CHECK_LAUNCH();
        });
      } else {
        native::copy_(native::slice(out, dim, at, at + len, 1), t);
      }
    }
    at += len;
  }
}

// ---- index_select / index_add (x viewed as [outer, n, inner], index 1-D)

template <typename W, typename I>
__global__ void index_select_kernel(W* out, const W* x, const I* idx, int64_t total, int64_t n, int64_t m,
                                    int64_t row_words) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = t / row_words, c = t - r * row_words;
    const int64_t o = r / m, j = r - o * m;
    out[t] = x[(o * n + int64_t(idx[j])) * row_words + c];
  }
}

void index_select_cuda(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) {
  cuda::DeviceGuard guard(out.device(), "index_select");
  const cudaStream_t stream = cuda::current_stream();
  const int64_t n = x.size(dim), m = index.numel();
  const int64_t outer = prod(x.shape(), 0, dim), inner = prod(x.shape(), dim + 1, x.dim());
  check_indices(index, n, "index_select", [&](int64_t v, int64_t) { fail_index("index_select", v, dim, n); });
  if (out.numel() == 0) return;
  const int64_t row_bytes = inner * int64_t(x.element_size());
  const size_t w = word_width({uint64_t(row_bytes), address(out.raw_data()), address(x.raw_data())});
  const int64_t row_words = row_bytes / int64_t(w);
  const int64_t total = outer * m * row_words;
  visit_word(w, [&](auto wtag) {
    using W = typename decltype(wtag)::type;
    visit_index(index.dtype(), "index_select", [&](auto itag) {
      using I = typename decltype(itag)::type;
      index_select_kernel<W, I><<<cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(
          static_cast<W*>(out.raw_data()), static_cast<const W*>(x.raw_data()),
          static_cast<const I*>(index.raw_data()), total, n, m, row_words);
      EMBER_CUDA_CHECK_LAUNCH();
    });
  });
}

// One thread per (o, k, i) of [outer, m, inner]; the thread at the start of a run of equal rows
// in the sorted keys adds src[o, j, i] for the run's positions j, in order, to out[o, row, i].
template <typename T>
__global__ void index_add_kernel(T* out, const T* src, const uint64_t* keys, int64_t outer, int64_t n, int64_t m,
                                 int64_t inner, int pbits) {
  const uint64_t mask = (uint64_t(1) << pbits) - 1;
  const int64_t total = outer * m * inner;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = t / inner, i = t - r * inner;
    const int64_t o = r / m, k = r - o * m;
    const uint64_t row = keys[k] >> pbits;
    if (k > 0 && (keys[k - 1] >> pbits) == row) continue;
    T* dst = out + (o * n + int64_t(row)) * inner + i;
    const T* s = src + o * m * inner + i;
    T acc = *dst;
    for (int64_t kk = k; kk < m; ++kk) {
      const uint64_t key = keys[kk];
      if ((key >> pbits) != row) break;
      acc = add_step(acc, s[int64_t(key & mask) * inner]);
    }
    *dst = acc;
  }
}

void index_add_cuda(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  cuda::DeviceGuard guard(out.device(), "index_add");
  const cudaStream_t stream = cuda::current_stream();
  const int64_t n = out.size(dim), m = index.numel();
  const int64_t outer = prod(out.shape(), 0, dim), inner = prod(out.shape(), dim + 1, out.dim());
  check_indices(index, n, "index_add", [&](int64_t v, int64_t) { fail_index("index_add", v, dim, n); });
  if (src.numel() == 0) return;
  const int pbits = bits_of(uint64_t(m - 1));
  const int bits = pbits + bits_of(uint64_t(n - 1));
  EMBER_CHECK(bits <= 64, "index_add: ", m, " indices into a dim of size ", n, " are too many to sort");
  const Tensor sorted = sort_row_keys(index, out.device(), pbits, bits, "index_add", stream);
  const int64_t total = outer * m * inner;
  cuda::visit_device_type(out.dtype(), "index_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    index_add_kernel<T><<<cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(out.raw_data()), static_cast<const T*>(src.raw_data()),
        static_cast<const uint64_t*>(sorted.raw_data()), outer, n, m, inner, pbits);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

// ---- gather / scatter_add
// The index (shape I, contiguous) is viewed as [outer, len, inner]; element p of it addresses the
// contiguous data tensor (shape X, X[k] >= I[k] off `dim`) at
// outer_offset(o) + index[p] * dim_stride + inner_offset(i). Where I and X agree on the dims
// before (after) `dim` the offsets are o * outer_stride (i) and need no table.

struct GatherOffsets {
  const int64_t* outer_table;  // null: o * outer_stride
  const int64_t* inner_table;  // null: i
  int64_t outer_stride, dim_stride, len, inner;

  __device__ __forceinline__ int64_t at(int64_t p, int64_t v) const {
    const int64_t r = p / inner, i = p - r * inner;
    const int64_t o = r / len;
    return (outer_table ? outer_table[o] : o * outer_stride) + v * dim_stride + (inner_table ? inner_table[i] : i);
  }
};

// Holds the offset tables (when needed) on the device for as long as the kernels use them.
struct GatherGeometry {
  GatherOffsets g{};
  Tensor outer_table, inner_table;

  GatherGeometry(const Shape& data_shape, const Shape& index_shape, int64_t dim, Device device) {
    const int64_t nd = int64_t(index_shape.size());
    const Shape strides = contiguous_strides(data_shape);
    const int64_t outer = prod(index_shape, 0, dim);
    g.len = index_shape[size_t(dim)];
    g.inner = prod(index_shape, dim + 1, nd);
    g.dim_stride = strides[size_t(dim)];
    g.outer_stride = dim > 0 ? strides[size_t(dim - 1)] : 0;
    bool same_inner = true, same_outer = true;
    for (int64_t k = 0; k < nd; ++k) {
      if (k < dim) same_outer = same_outer && index_shape[size_t(k)] == data_shape[size_t(k)];
      if (k > dim) same_inner = same_inner && index_shape[size_t(k)] == data_shape[size_t(k)];
    }
    if (!same_inner) {
      std::vector<int64_t> table(static_cast<size_t>(g.inner));
      for (int64_t i = 0; i < g.inner; ++i) {
        int64_t rest = i, off = 0;
        for (int64_t k = nd - 1; k > dim; --k) {
          off += (rest % index_shape[size_t(k)]) * strides[size_t(k)];
          rest /= index_shape[size_t(k)];
        }
        table[size_t(i)] = off;
      }
      inner_table = from_buffer(table.data(), {g.inner}, DType::i64, device);
      g.inner_table = static_cast<const int64_t*>(inner_table.raw_data());
    }
    if (!same_outer) {
      std::vector<int64_t> table(static_cast<size_t>(outer));
      for (int64_t o = 0; o < outer; ++o) {
        int64_t rest = o, off = 0;
        for (int64_t k = dim - 1; k >= 0; --k) {
          off += (rest % index_shape[size_t(k)]) * strides[size_t(k)];
          rest /= index_shape[size_t(k)];
        }
        table[size_t(o)] = off;
      }
      outer_table = from_buffer(table.data(), {outer}, DType::i64, device);
      g.outer_table = static_cast<const int64_t*>(outer_table.raw_data());
    }
  }
};

template <typename E, typename I>
__global__ void gather_kernel(E* out, const E* x, const I* idx, GatherOffsets g, int64_t total, int64_t size,
                              unsigned long long* bad) {
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < total; p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t v = int64_t(idx[p]);
    if (out_of_range(v, size)) {
      note_bad(bad, p);
      continue;
    }
    out[p] = x[g.at(p, v)];
  }
}

void gather_cuda(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) {
  cuda::DeviceGuard guard(out.device(), "gather");
  if (out.numel() == 0) return;
  const cudaStream_t stream = cuda::current_stream();
  const GatherGeometry geo(x.shape(), index.shape(), dim, out.device());
  const int64_t size = x.size(dim), total = out.numel();
  const BadIndex bad(out.device(), stream);
  visit_word(x.element_size(), [&](auto etag) {
    using E = typename decltype(etag)::type;
    visit_index(index.dtype(), "gather", [&](auto itag) {
      using I = typename decltype(itag)::type;
      gather_kernel<E, I><<<cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(
          static_cast<E*>(out.raw_data()), static_cast<const E*>(x.raw_data()),
          static_cast<const I*>(index.raw_data()), geo.g, total, size, bad.ptr());
      EMBER_CUDA_CHECK_LAUNCH();
    });
  });
  const int64_t pos = bad.first();
  if (pos >= 0) fail_index("gather", index_value_at(index, pos, stream), dim, size);
}

// keys[p] = destination offset << pbits | p; bad indices are recorded (their keys are unused).
template <typename I>
__global__ void scatter_keys_kernel(uint64_t* keys, const I* idx, GatherOffsets g, int64_t total, int64_t size,
                                    int pbits, unsigned long long* bad) {
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < total; p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t v = int64_t(idx[p]);
    if (out_of_range(v, size)) {
      note_bad(bad, p);
      keys[p] = 0;
      continue;
    }
    keys[p] = (uint64_t(g.at(p, v)) << pbits) | uint64_t(p);
  }
}

// The thread at the start of each run of equal destinations adds the run's sources in order.
template <typename T>
__global__ void scatter_add_kernel(T* out, const T* src, const uint64_t* keys, int64_t total, int pbits) {
  const uint64_t mask = (uint64_t(1) << pbits) - 1;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t dest = keys[k] >> pbits;
    if (k > 0 && (keys[k - 1] >> pbits) == dest) continue;
    T acc = out[dest];
    for (int64_t kk = k; kk < total; ++kk) {
      const uint64_t key = keys[kk];
      if ((key >> pbits) != dest) break;
      acc = add_step(acc, src[key & mask]);
    }
    out[dest] = acc;
  }
}

void scatter_add_cuda(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  cuda::DeviceGuard guard(out.device(), "scatter_add");
  const int64_t total = index.numel();
  if (total == 0) return;
  const cudaStream_t stream = cuda::current_stream();
  const GatherGeometry geo(out.shape(), index.shape(), dim, out.device());
  const int64_t size = out.size(dim);
  const int pbits = bits_of(uint64_t(total - 1));
  const Tensor keys = empty({total}, {DType::i64, out.device()});
  const BadIndex bad(out.device(), stream);
  visit_index(index.dtype(), "scatter_add", [&](auto itag) {
    using I = typename decltype(itag)::type;
    scatter_keys_kernel<I><<<cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(
        static_cast<uint64_t*>(keys.raw_data()), static_cast<const I*>(index.raw_data()), geo.g, total, size, pbits,
        bad.ptr());
    EMBER_CUDA_CHECK_LAUNCH();
  });
  const int64_t pos = bad.first();
  if (pos >= 0) fail_index("scatter_add", index_value_at(index, pos, stream), dim, size);
  // Every index is valid here, so out holds at least one element.
  const int bits = pbits + bits_of(uint64_t(out.numel() - 1));
  EMBER_CHECK(bits <= 64, "scatter_add: ", total, " indices into a tensor of ", out.numel(),
              " elements are too many to sort");
  const Tensor sorted = sort_keys(keys, total, bits, stream);
  cuda::visit_device_type(out.dtype(), "scatter_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    scatter_add_kernel<T><<<cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(out.raw_data()), static_cast<const T*>(src.raw_data()),
        static_cast<const uint64_t*>(sorted.raw_data()), total, pbits);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

// ---- one_hot

template <typename I>
__global__ void one_hot_kernel(int64_t* out, const I* idx, int64_t total, int64_t classes) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = t / classes, c = t - k * classes;
    out[t] = int64_t(idx[k]) == c ? 1 : 0;
  }
}

void one_hot_cuda(const Tensor& out, const Tensor& indices, int64_t num_classes) {
  cuda::DeviceGuard guard(out.device(), "one_hot");
  const cudaStream_t stream = cuda::current_stream();
  check_indices(indices, num_classes, "one_hot", [&](int64_t v, int64_t) {
    EMBER_FAIL("one_hot: class index ", v, " is out of range for ", num_classes, " classes (valid range [0, ",
               num_classes, "))");
  });
  const int64_t total = out.numel();
  if (total == 0) return;
  visit_index(indices.dtype(), "one_hot", [&](auto itag) {
    using I = typename decltype(itag)::type;
    one_hot_kernel<I><<<cuda::grid_for(total, kThreads), kThreads, 0, stream>>>(
        static_cast<int64_t*>(out.raw_data()), static_cast<const I*>(indices.raw_data()), total, num_classes);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::cat_stub, CUDA, &cat_cuda);
EMBER_REGISTER_KERNEL(native::index_select_stub, CUDA, &index_select_cuda);
EMBER_REGISTER_KERNEL(native::index_add_stub, CUDA, &index_add_cuda);
EMBER_REGISTER_KERNEL(native::gather_stub, CUDA, &gather_cuda);
EMBER_REGISTER_KERNEL(native::scatter_add_stub, CUDA, &scatter_add_cuda);
EMBER_REGISTER_KERNEL(native::one_hot_stub, CUDA, &one_hot_cuda);

}  // namespace ember
