// Reference embedding, dropout and cross-entropy, written from their definitions.
#pragma once
#include "core/rng.h"
#include "kernels/reference/ref_tensor.h"

namespace ember::reference {

// weight [V, D], indices of any shape -> indices.shape + [D]
RefTensor embedding(const RefTensor& weight, const RefTensor& indices);
// Sum of grad rows per index into [num_embeddings, D]; the row at padding_idx (-1: none) stays 0.
RefTensor embedding_backward(const RefTensor& grad, const RefTensor& indices, int64_t num_embeddings,
                             int64_t padding_idx);

// 1 where element i (row-major) survives: the Philox uniform of word i % 4 of counter
// state.offset + i / 4 is >= p.
RefTensor dropout_mask(const Shape& shape, double p, GeneratorState state);
// x * mask / (1 - p)
RefTensor dropout(const RefTensor& x, double p, GeneratorState state);

// logits [N, C, d...] (or [C]), target [N, d...] (or []) holding class indices or ignore_index.
// Per position: (1 - eps) * -log p[target] + eps * mean_c(-log p[c]); ignored positions give 0.
// Mean divides the sum by the number of non-ignored positions.
RefTensor cross_entropy(const RefTensor& logits, const RefTensor& target, int64_t ignore_index,
                        double label_smoothing, Reduction reduction);
// d(loss)/d(logits) for the upstream gradient grad_loss (target-shaped for None, one element otherwise).
RefTensor cross_entropy_backward(const RefTensor& logits, const RefTensor& target, const RefTensor& grad_loss,
                                 int64_t ignore_index, double label_smoothing, Reduction reduction);

// logits = x [..., in] @ weight[out, in]^T (+ bias[out] when has_bias), and the cross-entropy of
// those logits taken as [rows, out] against target (one class index per row of x, any shape).
struct LinearCrossEntropy {
  RefTensor logits, loss;
};
LinearCrossEntropy linear_cross_entropy(const RefTensor& x, const RefTensor& weight, const RefTensor& bias,
                                        bool has_bias, const RefTensor& target, int64_t ignore_index,
                                        double label_smoothing, Reduction reduction);
// The gradients of that loss for the upstream gradient grad_loss: dlogits [rows, out] from
// cross_entropy_backward, dx = dlogits @ weight, dweight = dlogits^T @ x, dbias = column sums.
struct LinearCrossEntropyGrads {
  RefTensor dx, dweight, dbias;
};
LinearCrossEntropyGrads linear_cross_entropy_backward(const RefTensor& x, const RefTensor& weight,
                                                      const RefTensor& bias, bool has_bias, const RefTensor& target,
                                                      const RefTensor& grad_loss, int64_t ignore_index,
                                                      double label_smoothing, Reduction reduction);

}  // namespace ember::reference
