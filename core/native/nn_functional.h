// Embedding, dropout and cross-entropy without autograd: argument checks, output allocation and
// the dispatch to the device kernels. autograd/functions/nn_functional.cpp adds the backward.
#pragma once
#include <optional>

#include "core/dispatch.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace ember::native {

// ---- embedding
// out[j, :] = weight[indices[j], :]; weight [V, D] and indices (1-D) contiguous, out [n, D].
EMBER_DECLARE_STUB(embedding_stub, void (*)(const Tensor& out, const Tensor& weight, const Tensor& indices));
// grad_weight [V, D] (zero on entry) gets the sum of grad rows [n, D] at their indices; rows at
// `padding_idx` (-1: none) stay zero. Sums run in position order, so results are deterministic.
EMBER_DECLARE_STUB(embedding_backward_stub, void (*)(const Tensor& grad_weight, const Tensor& grad,
                                                     const Tensor& indices, int64_t padding_idx));

// A valid padding row in [0, num_embeddings) (negative values count from the end), or -1 for none.
int64_t embedding_padding_row(std::optional<int64_t> padding_idx, int64_t num_embeddings);
// Rows of `weight` [V, D] for int32/int64 indices of any shape: result indices.shape + [D].
Tensor embedding(const Tensor& weight, const Tensor& indices);
// Gradient for `weight` from `grad` (indices.shape + [D]); padding_row from embedding_padding_row.
Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_embeddings, int64_t padding_row);

// ---- dropout
// Element i (logical order) keeps when the Philox uniform of word i % 4 of counter
// state.offset + i / 4 is >= p (each counter's block feeds four elements):
// mask[i] = keep, out[i] = x[i] * (keep ? scale : 0) (a product, so NaN/inf stay visible, as in
// PyTorch). x, out contiguous; mask bool.
EMBER_DECLARE_STUB(dropout_stub, void (*)(const Tensor& out, const Tensor& mask, const Tensor& x, double p,
                                          double scale, GeneratorState state));
// grad_in = grad_out * (mask ? scale : 0) (all contiguous, one shape).
EMBER_DECLARE_STUB(dropout_backward_stub, void (*)(const Tensor& grad_in, const Tensor& grad_out,
                                                   const Tensor& mask, double scale));

void check_dropout_probability(double p);
struct DropoutResult {
  Tensor out;
  Tensor mask;  // bool, x's shape
};
// Training-mode dropout for 0 <= p < 1: draws x.numel() counters from `gen`.
DropoutResult dropout(const Tensor& x, double p, Generator& gen = default_generator());
Tensor dropout_backward(const Tensor& grad, const Tensor& mask, double scale);

// ---- cross entropy (log-softmax and negative log-likelihood fused)
struct CrossEntropyArgs {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  Reduction reduction = Reduction::Mean;
  // Return the loss in the accumulation type (f32 for f16/bf16 logits) rather than the logits'
  // dtype: autocast's f32 policy without a converted copy of the logits.
  bool accumulate_type_loss = false;
};
// logits [N, C, D] contiguous, target [N, D] contiguous. Writes the loss (target-shaped for
// Reduction::None, else one element; logits' dtype, or lse's with accumulate_type_loss) and the log-sum-exp of each (n, d) row
// into lse (f64 for f64 logits, f32 otherwise). Returns the number of non-ignored targets.
EMBER_DECLARE_STUB(cross_entropy_stub, int64_t (*)(const Tensor& loss, const Tensor& lse, const Tensor& logits,
                                                   const Tensor& target, const CrossEntropyArgs& args));
// grad_logits [N, C, D] = g * (softmax - (1 - eps) * onehot(target) - eps / C), zero on ignored
// rows. grad_loss is flat, in lse's dtype: g = grad_loss[row] (None), grad_loss[0] / count (Mean)
// or grad_loss[0] (Sum).
EMBER_DECLARE_STUB(cross_entropy_backward_stub,
                   void (*)(const Tensor& grad_logits, const Tensor& grad_loss, const Tensor& logits,
                            const Tensor& target, const Tensor& lse, const CrossEntropyArgs& args, int64_t count));

// linear_cross_entropy's backward for logits [N, C] (d == 1): grad_logits as
// cross_entropy_backward_stub writes it, and grad_bias [C] (lse's dtype) = the column sums of
// grad_logits, the gradient of the bias added to every row of the logits, formed from the
// unrounded values as the rows are written: no second pass over grad_logits. Sums run in
// double over fixed blocks of rows, the blocks added in order: the same bits for any thread count.
// With row_index (int64 [S], ascending) defined, grad_logits is [S, C] and holds only the listed
// rows; grad_bias is the same as when every row is written, provided no unlisted row is scored.
EMBER_DECLARE_STUB(linear_cross_entropy_backward_stub,
                   void (*)(const Tensor& grad_logits, const Tensor& grad_bias, const Tensor& grad_loss,
                            const Tensor& logits, const Tensor& target, const Tensor& lse,
                            const Tensor& row_index, const CrossEntropyArgs& args, int64_t count));

struct CrossEntropyResult {
  Tensor loss;
  Tensor lse;           // [N, D] row statistics for the backward
  Tensor logits;        // canonical [N, C, D] contiguous view of the logits
  Tensor target;        // canonical [N, D] contiguous target
  int64_t count = 0;    // targets that are not ignore_index
};
// logits [N, C] or [N, C, d1, ...] (or unbatched [C]); target class indices [N] or [N, d1, ...].
CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyArgs& args);
// Gradient for the logits, in their original shape.
Tensor cross_entropy_backward(const Tensor& grad_loss, const CrossEntropyResult& saved, const Shape& logits_shape,
                              const CrossEntropyArgs& args);

struct LinearCrossEntropyGrads {
  Tensor grad_logits;  // [N, C], the logits' dtype
  Tensor grad_bias;    // [C], lse's dtype (f32 for f16/bf16/f32 logits)
};
// The gradients of logits [N, C] saved by cross_entropy (two-dimensional logits only) and of a
// bias added to every one of their rows, in one pass. With scored_rows (from scored_rows()),
// grad_logits is [S, C]: the gradient of those rows only, every other row's being zero.
LinearCrossEntropyGrads linear_cross_entropy_backward(const Tensor& grad_loss, const CrossEntropyResult& saved,
                                                      const CrossEntropyArgs& args,
                                                      const Tensor& scored_rows = Tensor());
// The rows of a saved target [N, 1] whose class is not ignore_index, ascending, as int64 [S]:
// every other row of the logits' gradient is zero.
Tensor scored_rows(const CrossEntropyResult& saved, int64_t ignore_index);

}  // namespace ember::native
