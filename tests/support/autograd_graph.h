// Looking into the autograd graph from tests.
#pragma once
#include <string>

#include "core/tensor.h"

namespace ember::testing {

// Whether the autograd graph behind `t` holds a node named `name` ("CheckpointBackward", ...).
bool graph_has(const Tensor& t, const std::string& name);

}  // namespace ember::testing
