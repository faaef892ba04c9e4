// Reverse-mode execution: runs the graph behind `roots` once, in dependency order.
#pragma once
#include "autograd/node.h"

namespace ember::autograd {

// grads[i] seeds roots[i]; an undefined seed means ones (only for one-element roots).
void run_backward(const Tensors& roots, const Tensors& grads, bool retain_graph);

}  // namespace ember::autograd
