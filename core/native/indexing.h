// Joining, splitting and indexing without autograd: argument checks, output allocation and the
// dispatch to the device kernels. autograd/functions/indexing.cpp wraps these with their
// backward formulas.
//
// Index tensors are int32 or int64; index values must lie in [0, size) of the indexed dim
// (kernels check every value and throw naming the op, the bad index and the valid range).
#pragma once
#include <vector>

#include "core/dispatch.h"
#include "core/tensor.h"

namespace ember::native {

// out = the inputs laid end to end along `dim`. Inputs share out's dtype and rank and match
// out's shape except along `dim`, where their sizes add up to out's.
EMBER_DECLARE_STUB(cat_stub, void (*)(const Tensor& out, const std::vector<Tensor>& inputs, int64_t dim));
// out[.., j, ..] = x[.., index[j], ..] along `dim`; index is 1-D and contiguous.
EMBER_DECLARE_STUB(index_select_stub, void (*)(const Tensor& out, const Tensor& x, int64_t dim,
                                               const Tensor& index));
// out[.., index[j], ..] += src[.., j, ..] along `dim`, in place; index is 1-D and contiguous,
// src contiguous. Each element sums its contributions in index order (deterministic).
EMBER_DECLARE_STUB(index_add_stub, void (*)(const Tensor& out, int64_t dim, const Tensor& index,
                                            const Tensor& src));
// out[p] = x[p with coordinate `dim` replaced by index[p]]; out and index share a shape.
EMBER_DECLARE_STUB(gather_stub, void (*)(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index));
// out[p with coordinate `dim` replaced by index[p]] += src[p], in place; src has index's shape.
// Each element sums its contributions in index order (deterministic).
EMBER_DECLARE_STUB(scatter_add_stub, void (*)(const Tensor& out, int64_t dim, const Tensor& index,
                                              const Tensor& src));
// out[..., c] = (indices[...] == c); out is int64 of shape indices.shape + [num_classes].
EMBER_DECLARE_STUB(one_hot_stub, void (*)(const Tensor& out, const Tensor& indices, int64_t num_classes));

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim);
// Sizes of the pieces `split` cuts a dim of `dim_size` into (last piece may be smaller).
std::vector<int64_t> split_sizes(int64_t dim_size, int64_t split_size, const char* op = "split");
// Sizes of the pieces `chunk` cuts a dim into: ceil(dim_size / chunks) each, as PyTorch.
std::vector<int64_t> chunk_sizes(int64_t dim_size, int64_t chunks);
// Checks explicit split sizes against the dim they cut.
void check_split_sizes(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// x with src's slices added at `index` along `dim` (out of place); the backward of index_select.
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
Tensor one_hot(const Tensor& indices, int64_t num_classes);

}  // namespace ember::native
