// CPU embedding lookup and its backward.
//
// The backward groups positions by the row they read (a sort of (index, position) pairs), then
// hands whole rows to threads: no two threads write the same row, and each row sums its
// gradients in position order, in the accumulation type, so the result is deterministic.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/native/nn_functional.h"
#include "core/parallel.h"
#include "core/type_dispatch.h"

namespace ember {
namespace {

template <typename I>
void check_embedding_indices(const I* idx, int64_t n, int64_t num_embeddings) {
  bool bad = false;
  for (int64_t k = 0; k < n; ++k) bad |= uint64_t(int64_t(idx[k])) >= uint64_t(num_embeddings);
  if (!bad) return;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t v = int64_t(idx[k]);
    EMBER_CHECK(v >= 0 && v < num_embeddings, "embedding: index ", v, " at position ", k, " is out of range for ",
                num_embeddings, " embeddings (valid range [0, ", num_embeddings, "))");
  }
}

void embedding_cpu(const Tensor& out, const Tensor& weight, const Tensor& indices) {
  const int64_t num = weight.size(0), n = indices.numel();
  const int64_t row = weight.size(1) * int64_t(weight.element_size());
  visit_index(indices.dtype(), "embedding", [&](auto itag) {
    using I = typename decltype(itag)::type;
    const I* idx = indices.data_ptr<I>();
    check_embedding_indices(idx, n, num);
    if (row == 0) return;
    const char* w = static_cast<const char*>(weight.raw_data());
    char* o = static_cast<char*>(out.raw_data());
    parallel_for(0, n, std::max<int64_t>(1, 65536 / row), [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) std::memcpy(o + k * row, w + int64_t(idx[k]) * row, size_t(row));
    });
  });
}

void embedding_backward_cpu(const Tensor& grad_weight, const Tensor& grad, const Tensor& indices, int64_t padding_idx) {
  const int64_t num = grad_weight.size(0), dim = grad_weight.size(1), n = indices.numel();
  // (row, position) pairs sorted by row, then position.
  std::vector<std::pair<int64_t, int64_t>> order(static_cast<size_t>(n));
  visit_index(indices.dtype(), "embedding_backward", [&](auto itag) {
    using I = typename decltype(itag)::type;
    const I* idx = indices.data_ptr<I>();
    check_embedding_indices(idx, n, num);
    for (int64_t k = 0; k < n; ++k) order[size_t(k)] = {int64_t(idx[k]), k};
  });
  std::sort(order.begin(), order.end());
  std::vector<int64_t> starts;  // first entry of each run of equal rows
  for (int64_t k = 0; k < n; ++k)
    if (k == 0 || order[size_t(k)].first != order[size_t(k - 1)].first) starts.push_back(k);
  starts.push_back(n);
  const int64_t runs = int64_t(starts.size()) - 1;

  visit_floating(grad_weight.dtype(), "embedding_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    T* gw = grad_weight.data_ptr<T>();
    const T* g = grad.data_ptr<T>();
    const int64_t work_per_run = std::max<int64_t>(1, dim * n / std::max<int64_t>(runs, 1));
    const int64_t grain = std::max<int64_t>(1, 16384 / work_per_run);
    parallel_for(0, runs, grain, [&](int64_t b, int64_t e) {
      std::vector<A> acc(static_cast<size_t>(dim));
      for (int64_t r = b; r < e; ++r) {
        const int64_t row = order[size_t(starts[size_t(r)])].first;
        if (row == padding_idx) continue;
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t k = starts[size_t(r)]; k < starts[size_t(r + 1)]; ++k) {
          const T* src = g + order[size_t(k)].second * dim;
          for (int64_t i = 0; i < dim; ++i) acc[size_t(i)] += A(src[i]);
        }
        T* dst = gw + row * dim;
        for (int64_t i = 0; i < dim; ++i) dst[i] = T(acc[size_t(i)]);
      }
    });
  });
}

}  // namespace

EMBER_REGISTER_KERNEL(native::embedding_stub, CPU, &embedding_cpu);
EMBER_REGISTER_KERNEL(native::embedding_backward_stub, CPU, &embedding_backward_cpu);

}  // namespace ember
