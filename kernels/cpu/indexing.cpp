// CPU kernels for cat, index_select / index_add, gather / scatter_add and one_hot.
//
// Pure data movement (cat, index_select, gather) copies bytes by element size, so every dtype
// shares one instantiation per size. The accumulating kernels (index_add, scatter_add) split the
// work so that no two threads ever touch the same output element, and each element sums its
// contributions in index order: the result does not depend on the thread count.
#include <algorithm>
#include <cstring>

#include "core/native/copy.h"
#include "core/native/indexing.h"
#include "core/native/views.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"

namespace ember {
namespace {

// Work per parallel chunk, in bytes moved (or elements added).
constexpr int64_t kGrainBytes = 64 * 1024;

int64_t prod(const Shape& s, int64_t begin, int64_t end) {
  int64_t p = 1;
  for (int64_t k = begin; k < end; ++k) p *= s[size_t(k)];
  return p;
}

// Calls fn with an unsigned integer type of the given size (a byte-exact stand-in for any dtype).
template <typename F>
void visit_element_size(size_t size, F&& fn) {
  switch (size) {
    case 1: fn(type_tag<uint8_t>{}); break;
    case 2: fn(type_tag<uint16_t>{}); break;
    case 4: fn(type_tag<uint32_t>{}); break;
    case 8: fn(type_tag<uint64_t>{}); break;
    default: EMBER_FAIL("indexing: unsupported element size ", size);
  }
}

[[noreturn]] void fail_index(const char* op, int64_t index, int64_t dim, int64_t size) {
  EMBER_FAIL(op, ": index ", index, " is out of range for dim ", dim, " of size ", size, " (valid range [0, ",
             size, "))");
}

inline bool out_of_range(int64_t v, int64_t size) { return uint64_t(v) >= uint64_t(size); }

// Checks every index up front (used where indices are few compared to the data they move).
template <typename I>
void check_indices(const I* idx, int64_t n, int64_t size, const char* op, int64_t dim) {
  bool bad = false;
  for (int64_t k = 0; k < n; ++k) bad |= out_of_range(int64_t(idx[k]), size);
  if (!bad) return;
  for (int64_t k = 0; k < n; ++k)
    if (out_of_range(int64_t(idx[k]), size)) fail_index(op, int64_t(idx[k]), dim, size);
}

// ---- cat

void cat_cpu(const Tensor& out, const std::vector<Tensor>& inputs, int64_t dim) {
  const Shape& os = out.shape();
  const int64_t outer = prod(os, 0, dim);
  const int64_t inner = prod(os, dim + 1, out.dim());
  const int64_t es = int64_t(out.element_size());
  const int64_t out_row = os[size_t(dim)] * inner * es;  // bytes of one outer slice of out

  struct Part {
    const char* src;
    int64_t bytes;   // per outer slice
    int64_t offset;  // byte offset inside an outer slice of out
  };
  std::vector<Part> parts;
  int64_t offset = 0;
  for (const Tensor& t : inputs) {
    const int64_t bytes = t.size(dim) * inner * es;
    if (t.is_contiguous()) {
      parts.push_back({static_cast<const char*>(t.raw_data()), bytes, offset});
    } else {
      native::copy_(native::slice(out, dim, offset / (inner * es), offset / (inner * es) + t.size(dim), 1), t);
    }
    offset += bytes;
  }
  if (parts.empty()) return;
  char* dst = static_cast<char*>(out.raw_data());
  const int64_t grain = std::max<int64_t>(1, kGrainBytes / std::max<int64_t>(out_row, 1));
  parallel_for(0, outer, grain, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o)
      for (const Part& p : parts) std::memcpy(dst + o * out_row + p.offset, p.src + o * p.bytes, size_t(p.bytes));
  });
}

// ---- index_select / index_add (x viewed as [outer, n, inner], index 1-D)

void index_select_cpu(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) {
  const int64_t n = x.size(dim), m = index.numel();
  const int64_t outer = prod(x.shape(), 0, dim), inner = prod(x.shape(), dim + 1, x.dim());
  const int64_t es = int64_t(x.element_size());
  visit_index(index.dtype(), "index_select", [&](auto itag) {
    using I = typename decltype(itag)::type;
    const I* idx = index.data_ptr<I>();
    check_indices(idx, m, n, "index_select", dim);
    if (out.numel() == 0) return;
    const char* src = static_cast<const char*>(x.raw_data());
    char* dst = static_cast<char*>(out.raw_data());
    if (inner == 1) {
      visit_element_size(size_t(es), [&](auto etag) {
        using E = typename decltype(etag)::type;
        const E* s = reinterpret_cast<const E*>(src);
        E* o = reinterpret_cast<E*>(dst);
        parallel_for(0, outer, std::max<int64_t>(1, kGrainBytes / (m * es)), [&](int64_t b, int64_t e) {
          for (int64_t r = b; r < e; ++r)
            for (int64_t j = 0; j < m; ++j) o[r * m + j] = s[r * n + int64_t(idx[j])];
        });
      });
      return;
    }
    const int64_t row = inner * es;
    parallel_for(0, outer * m, std::max<int64_t>(1, kGrainBytes / row), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t o = r / m, j = r % m;
        std::memcpy(dst + r * row, src + (o * n + int64_t(idx[j])) * row, size_t(row));
      }
    });
  });
}

// Splits [0, inner) into blocks so that outer * blocks gives every thread work.
int64_t inner_block(int64_t outer, int64_t inner) {
  const int64_t threads = get_num_threads();
  if (outer >= threads || inner < 512) return std::max<int64_t>(inner, 1);
  return std::max<int64_t>(256, (inner + threads - 1) / threads);
}

void index_add_cpu(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  const int64_t n = out.size(dim), m = index.numel();
  const int64_t outer = prod(out.shape(), 0, dim), inner = prod(out.shape(), dim + 1, out.dim());
  visit_index(index.dtype(), "index_add", [&](auto itag) {
    using I = typename decltype(itag)::type;
    const I* idx = index.data_ptr<I>();
    check_indices(idx, m, n, "index_add", dim);
    if (src.numel() == 0) return;
    visit_all(out.dtype(), "index_add", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using A = acc_t<T>;
      T* o = out.data_ptr<T>();
      const T* s = src.data_ptr<T>();
      const int64_t block = inner_block(outer, inner);
      const int64_t blocks = (inner + block - 1) / block;
      const int64_t grain = std::max<int64_t>(1, kGrainBytes / std::max<int64_t>(m * block, 1));
      parallel_for(0, outer * blocks, grain, [&](int64_t b, int64_t e) {
        for (int64_t task = b; task < e; ++task) {
          const int64_t r = task / blocks, i0 = (task % blocks) * block, i1 = std::min(inner, i0 + block);
          for (int64_t j = 0; j < m; ++j) {
            T* orow = o + (r * n + int64_t(idx[j])) * inner;
            const T* srow = s + (r * m + j) * inner;
            for (int64_t i = i0; i < i1; ++i) orow[i] = T(A(orow[i]) + A(srow[i]));
          }
        }
      });
    });
  });
}

// ---- gather / scatter_add
// The index (shape I) is viewed as [outer, I[dim], inner]. The data tensor (contiguous, shape X,
// with X[k] >= I[k] off `dim`) is addressed as outer_offset(o) + idx * stride[dim] + inner_offset[i].

struct GatherGeometry {
  int64_t dim, outer, len, inner, dim_stride;
  Shape index_shape, data_strides;
  std::vector<int64_t> inner_offset;

  GatherGeometry(const Shape& data_shape, const Shape& index_shape_in, int64_t d)
      : dim(d), index_shape(index_shape_in), data_strides(contiguous_strides(data_shape)) {
    const int64_t nd = int64_t(index_shape.size());
    outer = prod(index_shape, 0, dim);
    len = index_shape[size_t(dim)];
    inner = prod(index_shape, dim + 1, nd);
    dim_stride = data_strides[size_t(dim)];
    inner_offset.resize(size_t(inner));
    for (int64_t i = 0; i < inner; ++i) {
      int64_t rest = i, off = 0;
      for (int64_t k = nd - 1; k > dim; --k) {
        off += (rest % index_shape[size_t(k)]) * data_strides[size_t(k)];
        rest /= index_shape[size_t(k)];
      }
      inner_offset[size_t(i)] = off;
    }
  }

  int64_t outer_offset(int64_t o) const {
    int64_t off = 0;
    for (int64_t k = dim - 1; k >= 0; --k) {
      off += (o % index_shape[size_t(k)]) * data_strides[size_t(k)];
      o /= index_shape[size_t(k)];
    }
    return off;
  }
};

void gather_cpu(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) {
  if (out.numel() == 0) return;
  const GatherGeometry g(x.shape(), index.shape(), dim);
  const int64_t size = x.size(dim);
  visit_index(index.dtype(), "gather", [&](auto itag) {
    using I = typename decltype(itag)::type;
    const I* idx = index.data_ptr<I>();
    visit_element_size(x.element_size(), [&](auto etag) {
      using E = typename decltype(etag)::type;
      const E* s = static_cast<const E*>(x.raw_data());
      E* o = static_cast<E*>(out.raw_data());
      const int64_t grain = std::max<int64_t>(1, kGrainBytes / (8 * g.inner));
      parallel_for(0, g.outer * g.len, grain, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const E* base = s + g.outer_offset(r / g.len);
          const I* irow = idx + r * g.inner;
          E* orow = o + r * g.inner;
          for (int64_t i = 0; i < g.inner; ++i) {
            const int64_t v = int64_t(irow[i]);
            if (out_of_range(v, size)) fail_index("gather", v, dim, size);
            orow[i] = base[v * g.dim_stride + g.inner_offset[size_t(i)]];
          }
        }
      });
    });
  });
}

void scatter_add_cpu(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  const GatherGeometry g(out.shape(), index.shape(), dim);
  const int64_t size = out.size(dim);
  visit_index(index.dtype(), "scatter_add", [&](auto itag) {
    using I = typename decltype(itag)::type;
    const I* idx = index.data_ptr<I>();
    visit_all(out.dtype(), "scatter_add", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using A = acc_t<T>;
      T* o = out.data_ptr<T>();
      const T* s = src.data_ptr<T>();
      // Tasks own disjoint (outer, inner-block) fibres of the output; `len` runs in order.
      const int64_t block = inner_block(g.outer, g.inner);
      const int64_t blocks = (g.inner + block - 1) / block;
      const int64_t grain = std::max<int64_t>(1, kGrainBytes / std::max<int64_t>(g.len * block, 1));
      parallel_for(0, g.outer * blocks, grain, [&](int64_t b, int64_t e) {
        for (int64_t task = b; task < e; ++task) {
          const int64_t r = task / blocks, i0 = (task % blocks) * block, i1 = std::min(g.inner, i0 + block);
          T* base = o + g.outer_offset(r);
          for (int64_t j = 0; j < g.len; ++j) {
            const int64_t row = (r * g.len + j) * g.inner;
            for (int64_t i = i0; i < i1; ++i) {
              const int64_t v = int64_t(idx[row + i]);
              if (out_of_range(v, size)) fail_index("scatter_add", v, dim, size);
              T& dst = base[v * g.dim_stride + g.inner_offset[size_t(i)]];
              dst = T(A(dst) + A(s[row + i]));
            }
          }
        }
      });
    });
  });
}

// ---- one_hot

void one_hot_cpu(const Tensor& out, const Tensor& indices, int64_t num_classes) {
  visit_index(indices.dtype(), "one_hot", [&](auto itag) {
    using I = typename decltype(itag)::type;
    const I* idx = indices.data_ptr<I>();
    const int64_t n = indices.numel();
    for (int64_t k = 0; k < n; ++k) {
      const int64_t v = int64_t(idx[k]);
      EMBER_CHECK(!out_of_range(v, num_classes), "one_hot: class index ", v, " is out of range for ", num_classes,
                  " classes (valid range [0, ", num_classes, "))");
    }
    int64_t* o = out.data_ptr<int64_t>();
    const int64_t grain = std::max<int64_t>(1, kGrainBytes / (8 * std::max<int64_t>(num_classes, 1)));
    parallel_for(0, n, grain, [&](int64_t b, int64_t e) {
      std::memset(o + b * num_classes, 0, size_t((e - b) * num_classes) * sizeof(int64_t));
      for (int64_t k = b; k < e; ++k) o[k * num_classes + int64_t(idx[k])] = 1;
    });
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::cat_stub, CPU, &cat_cpu);
EMBER_REGISTER_KERNEL(native::index_select_stub, CPU, &index_select_cpu);
EMBER_REGISTER_KERNEL(native::index_add_stub, CPU, &index_add_cpu);
EMBER_REGISTER_KERNEL(native::gather_stub, CPU, &gather_cpu);
EMBER_REGISTER_KERNEL(native::scatter_add_stub, CPU, &scatter_add_cpu);
EMBER_REGISTER_KERNEL(native::one_hot_stub, CPU, &one_hot_cpu);

}  // namespace ember
