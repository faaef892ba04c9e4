// The gradients of the normalizations composed from differentiable ops: the history that
// normalization.cpp gives its fused backward kernels' values under create_graph
// (composed_gradient.h), so layer, RMS, group and batch norm can be differentiated twice. Each
// returns {dx, dweight, dbias} for grad_out g, undefined where not wanted (or where the input is
// empty: an empty gradient needs no history). weight may be undefined (no affine weight).
#pragma once
#include <functional>

#include "autograd/node.h"

namespace ember::autograd {

struct NormGradsWanted {
  bool dx, dweight, dbias;
};

// Normalised over the last normalized_shape.size() dims: mean and biased variance.
Tensors layer_norm_gradients(const Tensor& g, const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                             double eps, NormGradsWanted wanted);
// x / sqrt(mean(x^2) + eps) over the last normalized_shape.size() dims; {dx, dweight}.
Tensors rms_norm_gradients(const Tensor& g, const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                           double eps, NormGradsWanted wanted);
// x [N, C, *] normalised over each of num_groups groups of channels; weight and bias [C].
Tensors group_norm_gradients(const Tensor& g, const Tensor& x, int64_t num_groups, const Tensor& weight, double eps,
                             NormGradsWanted wanted);
// Training: x [N, C, *] normalised per channel with the batch's own statistics.
Tensors batch_norm_gradients(const Tensor& g, const Tensor& x, const Tensor& weight, double eps,
                             NormGradsWanted wanted);

// A batch whose statistics span more than x (SyncBatchNorm: the batches of every rank).
// sum_over_batches takes per-channel sums of x's batch, [1, C, 1, ...], to those of the whole
// batch, differentiably; count is the whole batch's values per channel. Without
// sum_over_batches the batch is x alone.
struct WholeBatch {
  std::function<Tensor(const Tensor&)> sum_over_batches;
  double count = 0;
};
// Training with the whole batch's statistics. An empty x gets empty gradients with history, and
// sum_over_batches runs for it as for any other (the ranks' collectives stay matched).
Tensors batch_norm_gradients(const Tensor& g, const Tensor& x, const Tensor& weight, double eps,
                             NormGradsWanted wanted, const WholeBatch& whole_batch);
// Evaluation: fixed statistics mean and invstd [C], so the output is affine in x.
Tensors batch_norm_eval_gradients(const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                                  const Tensor& weight, NormGradsWanted wanted);

}  // namespace ember::autograd
