// Reference joining, splitting and indexing: one loop over output (or source) elements each,
// addressing through multi-indices. Index tensors hold integral values; dims may be negative.
#pragma once
#include <vector>

#include "kernels/reference/ref_tensor.h"

namespace ember::reference {

RefTensor cat(const std::vector<RefTensor>& xs, int64_t dim);
RefTensor stack(const std::vector<RefTensor>& xs, int64_t dim);
std::vector<RefTensor> split(const RefTensor& x, const std::vector<int64_t>& sizes, int64_t dim);
// out[.., j, ..] = x[.., index[j], ..]
RefTensor index_select(const RefTensor& x, int64_t dim, const RefTensor& index);
// x with out[.., index[j], ..] += src[.., j, ..]
RefTensor index_add(const RefTensor& x, int64_t dim, const RefTensor& index, const RefTensor& src);
// out[p] = x[p with coordinate dim replaced by index[p]]
RefTensor gather(const RefTensor& x, int64_t dim, const RefTensor& index);
// x with out[p with coordinate dim replaced by index[p]] += src[p] for every p of index
RefTensor scatter_add(const RefTensor& x, int64_t dim, const RefTensor& index, const RefTensor& src);
RefTensor one_hot(const RefTensor& indices, int64_t num_classes);

}  // namespace ember::reference
