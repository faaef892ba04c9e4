// Activation checkpointing (torch.utils.checkpoint): trades compute for memory by keeping only
// a function's inputs in the forward and running the function again in backward.
//
//   h = ember::checkpoint([&](const Tensor& x) { return layer->forward(x, mask); }, h);
//
// The forward runs fn under no-grad, so none of its intermediate activations are kept; it saves
// the inputs (as autograd saved tensors: an input written in place before backward is the
// version-counter error), the random generator's state and the autocast state of each device.
// Backward restores those, runs fn again with grad on fresh leaf copies of the inputs and
// backpropagates the incoming gradients through that rerun: the inputs' gradients flow on, and
// parameters fn captures get their .grad accumulated as without checkpointing. Philox is
// counter-based, so dropout draws the same masks bit for bit, and the generator is put back
// afterwards, so the recompute leaves the outer random stream as it was.
//
// Rules for fn:
// - It must compute the same thing twice: the same outputs (count, shapes, dtypes) from the same
//   inputs. Randomness from the default generator and autocast are replayed; other state is not.
// - A tensor that requires grad and has history (a non-leaf) reaches fn only as an input. One
//   captured by fn is refused with an ember::Error when backward reaches this checkpoint, before
//   any gradient is accumulated. Captured leaves (parameters) and tensors without grad are fine.
// - What fn captures by reference must outlive the backward (the rerun calls fn then).
// Under grad mode every floating-point output requires grad, even when only a captured
// parameter (or nothing) would have given it one; with grad mode off, checkpoint just calls fn.
// Callbacks queued by hooks during the rerun's backward run at the end of the outer backward.
// Checkpoints nest: fn may itself call checkpoint.
#pragma once
#include <functional>
#include <vector>

#include "core/tensor.h"

namespace ember {

Tensor checkpoint(std::function<Tensor(const Tensor&)> fn, const Tensor& input);

// Several inputs and outputs; undefined and non-floating-point entries pass through without
// gradient (an input that does not require grad gets none).
std::vector<Tensor> checkpoint(std::function<std::vector<Tensor>(const std::vector<Tensor>&)> fn,
                               const std::vector<Tensor>& inputs);

}  // namespace ember
