#include "core/sparse_grad.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "core/error.h"
#include "core/factory.h"
#include "core/grad_mode.h"
#include "core/native/copy.h"
#include "core/native/indexing.h"
#include "core/native/nn_functional.h"
#include "core/native/views.h"
#include "core/tensor_impl.h"

namespace ember {

namespace {
std::vector<int64_t> host_indices(const Tensor& indices) {
  EMBER_CHECK(indices.dtype() == DType::i64 || indices.dtype() == DType::i32,
              "row-sparse gradient: indices must be int64 or int32, got ", dtype_name(indices.dtype()));
  return indices.to_vector<int64_t>();
}
}  // namespace

RowSparseGrad coalesce_rows(const Tensor& indices, const Tensor& rows, int64_t num_rows, int64_t padding_row) {
  EMBER_CHECK(rows.dim() == indices.dim() + 1 && Shape(rows.shape().begin(), rows.shape().end() - 1) == indices.shape(),
              "row-sparse gradient: rows of shape ", rows.shape(), " do not match indices of shape ", indices.shape());
  NoGradGuard no_grad;
  const std::vector<int64_t> idx = host_indices(indices);
  std::vector<int64_t> distinct;
  distinct.reserve(idx.size());
  for (int64_t i : idx) {
    EMBER_CHECK(i >= 0 && i < num_rows, "row-sparse gradient: row index ", i, " out of range for ", num_rows, " rows");
    if (i != padding_row) distinct.push_back(i);
  }
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  const int64_t k = int64_t(distinct.size());
  // Each contribution goes to its row's place among the distinct rows; padding goes to an extra
  // row k that the kernel leaves zero and that is cut off after.
  std::vector<int64_t> compact(idx.size());
  for (size_t t = 0; t < idx.size(); ++t)
    compact[t] = idx[t] == padding_row ? k
                                       : int64_t(std::lower_bound(distinct.begin(), distinct.end(), idx[t]) -
                                                 distinct.begin());
  Tensor ids = native::to_device(from_vector<int64_t>(compact, indices.shape()), rows.device());
  Tensor summed = native::embedding_backward(rows, ids, k + 1, k);
  RowSparseGrad out;
  out.indices = from_vector<int64_t>(distinct, {k});
  out.values = native::contiguous(summed.narrow(0, 0, k));
  out.rows = num_rows;
  return out;
}

RowSparseGrad merge_row_sparse(const std::vector<RowSparseGrad>& parts) {
  std::vector<Tensor> indices, values;
  int64_t rows = -1;
  for (const RowSparseGrad& p : parts) {
    if (!p.defined()) continue;
    EMBER_CHECK(rows < 0 || rows == p.rows, "row-sparse gradient: parts of ", rows, " and ", p.rows,
                " rows cannot be merged");
    rows = p.rows;
    indices.push_back(p.indices);
    values.push_back(p.values);
  }
  if (indices.empty()) return {};
  if (indices.size() == 1) return RowSparseGrad{indices[0], values[0], rows};
  NoGradGuard no_grad;
  return coalesce_rows(native::cat(indices, 0), native::cat(values, 0), rows);
}

Tensor to_dense(const RowSparseGrad& g) {
  EMBER_CHECK(g.defined(), "row-sparse gradient: to_dense of an empty gradient");
  NoGradGuard no_grad;
  return native::embedding_backward(g.values, native::to_device(g.indices, g.values.device()), g.rows, -1);
}

void add_rows_into(const Tensor& dense, const RowSparseGrad& g) {
  if (!g.defined() || g.nnz_rows() == 0) return;
  EMBER_CHECK(dense.dim() == 2 && dense.size(0) == g.rows && dense.size(1) == g.values.size(1),
              "row-sparse gradient: cannot add ", g.nnz_rows(), " rows of ", g.values.size(1), " into a tensor of shape ",
              dense.shape());
  NoGradGuard no_grad;
  // dense[r] += values[k], row by row: what adding the zero-filled table gives, without it.
  if (!dense.is_contiguous()) {  // a strided gradient takes the zero-filled table
    Tensor(dense).add_(to_dense(g));
    return;
  }
  const Tensor values =
      native::contiguous(native::to_device(native::to_dtype(g.values, dense.dtype()), dense.device()));
  native::index_add_stub.call(dense.device(), "index_add")(dense, 0, native::to_device(g.indices, dense.device()),
                                                           values);
  dense.bump_version();
}

RowSparseGrad scale_rows(const RowSparseGrad& g, double factor) {
  if (!g.defined()) return g;
  NoGradGuard no_grad;
  RowSparseGrad out = g;
  out.values = g.values.clone();
  out.values.mul_(factor);
  return out;
}

// ---- the Tensor members that keep a parameter's row-sparse part

Tensor& Tensor::set_row_sparse_grad(bool on) {
  EMBER_CHECK(!on || (is_leaf() && dim() == 2), "set_row_sparse_grad: only a 2-D leaf (an embedding table) takes "
              "row-sparse gradients; got a ", is_leaf() ? "leaf" : "non-leaf", " of shape ", shape());
  checked()->row_sparse_grad = on;
  return *this;
}

bool Tensor::row_sparse_grad() const { return checked()->row_sparse_grad; }

bool Tensor::has_sparse_grad() const { return checked()->sparse_grad != nullptr; }

RowSparseGrad Tensor::sparse_grad() const {
  const auto& s = checked()->sparse_grad;
  return s ? *s : RowSparseGrad{};
}

void Tensor::set_sparse_grad(const RowSparseGrad& g) {
  if (g.defined()) {
    EMBER_CHECK(dim() == 2 && g.rows == size(0) && g.values.dim() == 2 && g.values.size(1) == size(1) &&
                    g.values.size(0) == g.nnz_rows(),
                "set_sparse_grad: ", g.nnz_rows(), " rows of shape ", g.values.shape(), " for a tensor of shape ",
                shape());
    checked()->sparse_grad = std::make_shared<RowSparseGrad>(g);
  } else {
    checked()->sparse_grad.reset();
  }
}

void Tensor::accumulate_sparse_grad(const RowSparseGrad& part) {
  TensorImpl* impl = checked();
  Tensor values = part.values;
  if (values.dtype() != dtype()) values = native::to_dtype(values, dtype());
  const RowSparseGrad mine{part.indices, values, part.rows};
  set_sparse_grad(impl->sparse_grad ? merge_row_sparse({*impl->sparse_grad, mine}) : mine);
  // A snapshot, so a hook may register or remove hooks while they run.
  const std::vector<PostAccumulateHook> hooks = impl->post_accumulate_hooks;
  for (const PostAccumulateHook& hook : hooks) {
    if (!hook.sparse) continue;
    const bool registered = std::any_of(impl->post_accumulate_hooks.begin(), impl->post_accumulate_hooks.end(),
                                        [&](const PostAccumulateHook& h) { return h.id == hook.id; });
    if (registered) (*hook.fn)(*this);
  }
}

Tensor Tensor::dense_grad_part() const {
  const auto& g = checked()->grad;
  return g ? Tensor(g) : Tensor();
}

}  // namespace ember
