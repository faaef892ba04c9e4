#include "autograd_graph.h"

#include <unordered_set>
#include <vector>

#include "autograd/node.h"

namespace ember::testing {

bool graph_has(const Tensor& t, const std::string& name) {
  std::vector<autograd::Node*> stack;
  std::unordered_set<autograd::Node*> seen;
  if (t.grad_fn()) stack.push_back(t.grad_fn().get());
  while (!stack.empty()) {
    autograd::Node* n = stack.back();
    stack.pop_back();
    if (n->name() == name) return true;
    for (const autograd::Edge& e : n->next_edges)
      if (e.node && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
  }
  return false;
}

}  // namespace ember::testing
