// Reverse-mode execution: runs the graph behind `roots` once, in dependency order.
#pragma once
#include <functional>

#include "autograd/node.h"

namespace ember::autograd {

// grads[i] seeds roots[i]; an undefined seed means ones (only for one-element roots).
void run_backward(const Tensors& roots, const Tensors& grads, bool retain_graph);

// The gradients of `outputs` (seeded by grad_outputs, an undefined or missing seed meaning ones
// for a one-element output) with respect to `inputs`, returned rather than added into .grad
// (torch.autograd.grad): no leaf's .grad changes and no post-accumulate hook runs. An input the
// gradient does not reach gets an undefined tensor. Only the nodes with a path to an input run
// (not the layers below a captured activation, nor branches that reach no input). create_graph: the backward formulas run
// under grad mode, so the results have history and can be differentiated again (gradient
// penalties, double backward); the graph is then kept, else freed. A node whose formula is
// Backward::first_order gives gradients that raise an ember::Error naming it when a later
// backward reaches them, rather than missing its second-order terms.
// Tensor::backward has no create_graph on purpose: a .grad with history would hold the graph
// that reaches back to the leaf holding it (a reference cycle, which PyTorch warns about).
Tensors grad(const Tensors& outputs, const Tensors& inputs, const Tensors& grad_outputs = {},
             bool create_graph = false);

// run_backward from inside a backward formula, as one part of the pass already running on this
// thread (ember::checkpoint's recompute): callbacks queued during it join that pass and run when
// it finishes, so a hook's "after the whole backward" callback still means the outer one.
// Outside a backward pass it is run_backward. Never retains the graph.
void run_backward_within_pass(const Tensors& roots, const Tensors& grads);

// Queues `callback` to run once when the backward pass running on this thread has finished,
// after every gradient of that pass has been accumulated and every post-accumulate hook has
// run (DDP waits for its all-reduces there). Callbacks run on this thread in the order they
// were queued, still under no-grad mode; one queued by a callback runs in the same pass. A
// callback that throws drops the ones after it and the exception leaves backward(); a pass
// that fails drops its callbacks unrun. Each thread has its own passes, so concurrent
// backwards on different threads never see each other's callbacks. Calling it outside a
// backward pass is an ember::Error.
void queue_callback(std::function<void()> callback);

// True while this thread is inside a backward pass (in a hook, a backward formula or a callback).
bool in_backward();

// True while this thread runs the pass of autograd::grad, whose gradients are returned rather
// than added into .grad: a formula that writes a leaf's gradient itself (the row-sparse
// embedding's rows) returns it along its edge instead.
bool returning_gradients();

}  // namespace ember::autograd
