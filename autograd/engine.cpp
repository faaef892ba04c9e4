#include "autograd/engine.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <queue>
#include <unordered_map>

#include "core/autocast.h"
#include "core/factory.h"
#include "core/grad_mode.h"
#include "core/native/copy.h"
#include "core/ops.h"

namespace ember::autograd {
namespace {

struct NodeState {
  int dependencies = 0;
  Tensors grads;  // one slot per forward output
};

// Gradients meeting at one slot are summed. The slot's buffer is added into in place when
// nothing else can see it (a tensor some node produced for this pass alone, not a view, not
// saved anywhere); otherwise the sum goes to a new tensor in one pass over both, never as a
// copy followed by an in-place add.
void accumulate_into(Tensor& slot, Tensor g) {
  if (!slot.defined()) {
    slot = std::move(g);
    return;
  }
  if (GradMode::is_enabled() && (slot.requires_grad() || g.requires_grad())) {
    slot = slot + g;  // create_graph: the sum belongs to the new graph
    return;
  }
  NoGradGuard no_grad;
  const DType dtype = promote_types(slot.dtype(), g.dtype());
  const bool exclusive = slot.dtype() == dtype && slot.is_contiguous() && slot.impl_ptr().use_count() == 1 &&
                         slot.impl()->storage.use_count() == 1;
  if (exclusive) {
    slot.add_(g);
  } else {
    slot = native::to_dtype(slot, dtype) + g;
  }
}

// The callbacks of one backward pass. Passes nest (a hook or callback may call backward),
// so each thread keeps a stack; callbacks go to the innermost pass.
struct PassCallbacks {
  std::deque<std::function<void()>> queue;
};
thread_local std::vector<PassCallbacks*> pass_stack;
thread_local bool returning_pass = false;  // see returning_gradients()

struct ReturningScope {
  bool previous;
  explicit ReturningScope(bool returning) : previous(returning_pass) { returning_pass = returning; }
  ~ReturningScope() { returning_pass = previous; }
  ReturningScope(const ReturningScope&) = delete;
  ReturningScope& operator=(const ReturningScope&) = delete;
};

// join_enclosing: queue into the pass already running on this thread (if any), whose end runs them.
struct PassScope {
  PassCallbacks callbacks;
  PassCallbacks* target;
  explicit PassScope(bool join_enclosing)
      : target(join_enclosing && !pass_stack.empty() ? pass_stack.back() : &callbacks) {
    pass_stack.push_back(target);
  }
  ~PassScope() { pass_stack.pop_back(); }
  PassScope(const PassScope&) = delete;
  PassScope& operator=(const PassScope&) = delete;

  void run_callbacks() {
    if (target != &callbacks) return;  // the enclosing pass runs them
    while (!callbacks.queue.empty()) {
      std::function<void()> fn = std::move(callbacks.queue.front());
      callbacks.queue.pop_front();
      fn();
    }
  }
};

// How one pass runs, besides its roots and seeds.
struct PassOptions {
  bool retain_graph = false;
  bool join_enclosing = false;  // see run_backward_within_pass
  bool create_graph = false;    // formulas run under grad mode (autograd::grad)
  // autograd::grad: the edges whose incoming gradients are returned in `captured`; such a
  // pass runs no AccumulateGrad.
  const std::vector<Edge>* capture = nullptr;
  Tensors* captured = nullptr;
};

void run_backward_impl(const Tensors& roots, const Tensors& seeds, const PassOptions& opt);

// A gradient from a first_order node under create_graph: the same values behind a node that
// refuses a second backward, which would otherwise miss that node's second-order terms.
Tensor not_differentiable_again(const Tensor& g, const std::string& node_name) {
  Tensor alias = g.detach();
  record(node_name + "NotDifferentiable", {}, {alias}, [node_name](const Tensors&) -> Tensors {
    EMBER_FAIL("backward: ", node_name, " does not support double backward: a gradient computed by it with "
               "create_graph was differentiated again, and its backward formula is first-order only");
  });
  return alias;
}

Tensors apply_node(Node& node, Tensors&& grads, bool create_graph) {
  if (!create_graph || node.differentiable_backward()) return node.apply(std::move(grads));
  Tensors out;
  {
    NoGradGuard no_grad;
    out = node.apply(std::move(grads));
  }
  for (Tensor& t : out)
    if (t.defined()) t = not_differentiable_again(t, node.name());
  return out;
}

}  // namespace

void queue_callback(std::function<void()> callback) {
  EMBER_CHECK(!pass_stack.empty(), "queue_callback: no backward pass is running on this thread; "
              "queue callbacks from a hook or a backward formula");
  EMBER_CHECK(callback != nullptr, "queue_callback: empty callback");
  pass_stack.back()->queue.push_back(std::move(callback));
}

bool in_backward() { return !pass_stack.empty(); }

bool returning_gradients() { return returning_pass; }

void run_backward(const Tensors& roots, const Tensors& seeds, bool retain_graph) {
  run_backward_impl(roots, seeds, {.retain_graph = retain_graph});
}

void run_backward_within_pass(const Tensors& roots, const Tensors& seeds) {
  run_backward_impl(roots, seeds, {.join_enclosing = true});
}

Tensors grad(const Tensors& outputs, const Tensors& inputs, const Tensors& grad_outputs, bool create_graph) {
  EMBER_CHECK(!outputs.empty(), "grad: no outputs to differentiate");
  EMBER_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(), "grad: ", grad_outputs.size(),
              " grad_outputs for ", outputs.size(), " outputs");
  std::vector<Edge> capture;
  for (size_t i = 0; i < inputs.size(); ++i) {
    EMBER_CHECK(inputs[i].defined(), "grad: input ", i, " is undefined");
    EMBER_CHECK(inputs[i].requires_grad(), "grad: input ", i, " of shape ", inputs[i].shape(),
                " does not require grad");
    capture.push_back(gradient_edge(inputs[i]));
  }
  Tensors captured(inputs.size());
  run_backward_impl(outputs, grad_outputs,
                    {.retain_graph = create_graph, .create_graph = create_graph, .capture = &capture,
                     .captured = &captured});
  return captured;
}

namespace {
void run_backward_impl(const Tensors& roots, const Tensors& seeds, const PassOptions& opt) {
  std::optional<NoGradGuard> no_grad;
  std::optional<EnableGradGuard> with_grad;
  if (opt.create_graph) {
    with_grad.emplace();
  } else {
    no_grad.emplace();
  }
  // Backward formulas run in the forward's dtypes; weights change after it, so cached casts go.
  autocast::SuspendGuard no_autocast;
  autocast::clear_cache();
  PassScope pass(opt.join_enclosing);
  ReturningScope returning(opt.capture != nullptr);
  std::unordered_map<Node*, NodeState> state;
  std::vector<std::shared_ptr<Node>> root_nodes;

  // Seed the roots.
  std::vector<std::pair<Edge, Tensor>> root_edges;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    EMBER_CHECK(r.requires_grad(), "backward: tensor ", i, " of shape ", r.shape(),
                " does not require grad and has no grad_fn");
    Tensor g = i < seeds.size() ? seeds[i] : Tensor();
    if (!g.defined()) {
      EMBER_CHECK(r.numel() == 1, "backward: grad can be implicitly created only for one-element "
                  "outputs, got shape ", r.shape(), "; pass a gradient");
      g = ones(r.shape(), {r.dtype(), r.device()});
    }
    EMBER_CHECK(g.shape() == r.shape(), "backward: gradient of shape ", g.shape(),
                " does not match output of shape ", r.shape());
    root_edges.push_back({gradient_edge(r), g});
  }

  // Count, for every node reachable from the roots, how many edges lead into it.
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  std::unordered_map<Node*, std::vector<Node*>> parents;  // kept only for autograd::grad
  for (auto& [edge, g] : root_edges) {
    if (!seen[edge.node.get()]) {
      seen[edge.node.get()] = true;
      stack.push_back(edge.node.get());
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.valid()) continue;
      state[e.node.get()].dependencies++;
      if (opt.capture) parents[e.node.get()].push_back(n);
      if (!seen[e.node.get()]) {
        seen[e.node.get()] = true;
        stack.push_back(e.node.get());
      }
    }
  }

  // autograd::grad runs only the nodes with a path to a captured edge: the rest of the graph
  // (the layers below a captured activation, other branches) would compute gradients nobody reads.
  std::unordered_map<Node*, bool> leads_to_capture;
  if (opt.capture) {
    for (const Edge& c : *opt.capture)
      if (c.valid()) stack.push_back(c.node.get());
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      for (Node* p : parents[n]) {
        if (leads_to_capture[p]) continue;
        leads_to_capture[p] = true;
        stack.push_back(p);
      }
    }
  }

  auto cmp = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    return a->sequence_nr < b->sequence_nr;
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, decltype(cmp)> ready(cmp);

  for (auto& [edge, g] : root_edges) {
    NodeState& s = state[edge.node.get()];
    if (s.grads.empty()) s.grads.resize(std::max<size_t>(1, edge.node->outputs.size()));
    accumulate_into(s.grads[edge.input_nr], g);
  }
  for (auto& [edge, g] : root_edges) {
    NodeState& s = state[edge.node.get()];
    if (s.dependencies == 0 && !s.grads.empty()) {
      ready.push(edge.node);
      s.dependencies = -1;  // queued
    }
  }

  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    NodeState& s = state[node.get()];
    Tensors grads = std::move(s.grads);
    bool any = false;
    for (const Tensor& g : grads) any = any || g.defined();
    // Zeros only for a node that runs: a leaf's accumulator reached by an edge that brought
    // nothing (the row-sparse embedding's) must not cost a table of zeros.
    for (size_t i = 0; any && i < grads.size() && i < node->outputs.size(); ++i) {
      if (grads[i].defined()) continue;
      const auto& m = node->outputs[i];
      grads[i] = zeros(m.shape, {m.dtype, m.device});
    }
    Tensors out;
    if (any && opt.capture) {
      for (size_t c = 0; c < opt.capture->size(); ++c)
        if ((*opt.capture)[c].node == node) (*opt.captured)[c] = grads[(*opt.capture)[c].input_nr];
      // grad() leaves .grad alone (an AccumulateGrad leads nowhere) and skips dead branches.
      if (!leads_to_capture[node.get()]) any = false;
    }
    if (any) {
      out = apply_node(*node, std::move(grads), opt.create_graph);
      if (!opt.retain_graph) node->release();
      EMBER_CHECK(out.empty() || out.size() == node->next_edges.size(), "backward: ", node->name(),
                  " returned ", out.size(), " gradients for ", node->next_edges.size(), " inputs");
    }
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.valid()) continue;
      NodeState& ns = state[e.node.get()];
      if (ns.grads.empty()) ns.grads.resize(std::max<size_t>(1, e.node->outputs.size()));
      if (i < out.size() && out[i].defined()) {
        const auto* meta = e.node->outputs.empty() ? nullptr : &e.node->outputs[e.input_nr];
        if (meta) {
          EMBER_CHECK(out[i].shape() == meta->shape, "backward: ", node->name(), " produced a gradient of shape ",
                      out[i].shape(), " for input ", i, " of shape ", meta->shape);
        }
        accumulate_into(ns.grads[e.input_nr], out[i]);
      }
      if (--ns.dependencies == 0) ready.push(e.node);
    }
  }
  pass.run_callbacks();
}
}  // namespace

}  // namespace ember::autograd

namespace ember {
void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  autograd::run_backward({*this}, {grad}, retain_graph);
}
}  // namespace ember
