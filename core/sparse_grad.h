// Row-sparse gradients. A lookup into an embedding table touches only the rows it read (2,048
// tokens touch at most 2,048 of BERT's 30,522 rows), so the gradient of a table marked with
// Tensor::set_row_sparse_grad() arrives as those rows alone: distinct row indices and one row of
// values each. It waits on the parameter beside its dense .grad (a tied decoder's part, say)
// until something reads the whole gradient: Tensor::grad() adds it into the dense tensor then,
// so any code sees the full gradient without knowing. What reads the rows themselves uses
// Tensor::sparse_grad(): DDP's all-gather, a lazy AdamW, and, when the whole gradient is rows,
// the SGD/Adam/AdamW steps, clip_grad_norm_ and GradScaler, which give the dense results bit for
// bit (core/native/fused_optim.h). Besides torch-style Embedding(sparse=true), BERT's and GPT-2's
// word embeddings produce rows through nn::Embedding::row_sparse_backward.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "core/tensor.h"

namespace ember {

struct RowSparseGrad {
  Tensor indices;     // int64 [k] on the CPU: distinct, ascending, each in [0, rows)
  Tensor values;      // [k, D], contiguous, on the parameter's device and of its dtype
  int64_t rows = 0;   // the dense tensor's first dimension
  bool defined() const { return indices.defined(); }
  int64_t nnz_rows() const { return indices.defined() ? indices.numel() : 0; }
};

// embedding() whose backward leaves the table its rows whatever its row_sparse_grad flag (it
// must be a leaf): nn::Embedding::row_sparse_backward. Defined with embedding() in autograd.
Tensor embedding_with_row_sparse_backward(const Tensor& weight, const Tensor& indices,
                                          std::optional<int64_t> padding_idx = std::nullopt);

// Sums the rows that share an index. `indices` is an integer tensor of any shape (any device),
// `rows` has shape indices.shape + [D]; indices equal to padding_row (when >= 0) are dropped.
// Each output row adds its contributions in the order they appear (as the dense embedding
// backward does, so a rank's rows equal its dense gradient's bit for bit).
RowSparseGrad coalesce_rows(const Tensor& indices, const Tensor& rows, int64_t num_rows, int64_t padding_row = -1);
// Several row-sparse gradients of one parameter as one (undefined parts are skipped).
RowSparseGrad merge_row_sparse(const std::vector<RowSparseGrad>& parts);
// The dense [rows, D] tensor it stands for.
Tensor to_dense(const RowSparseGrad& g);
// dense += g, in place (dense is [g.rows, D]): each row g holds is added into its dense row;
// no table of zeros is built.
void add_rows_into(const Tensor& dense, const RowSparseGrad& g);
// The rows g holds, scaled by `factor` (the same indices).
RowSparseGrad scale_rows(const RowSparseGrad& g, double factor);

}  // namespace ember
