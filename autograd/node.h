// The autograd graph. Each differentiable op that sees an input requiring grad creates a
// Node holding what its backward needs; edges point from a node to the nodes (or leaf
// accumulators) that produced its inputs. The engine (engine.h) walks them in reverse.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ember::autograd {

using Tensors = std::vector<Tensor>;
class Node;

struct Edge {
  std::shared_ptr<Node> node;  // null: that input needs no gradient
  uint32_t input_nr = 0;       // which gradient slot of `node` this edge feeds
  bool valid() const { return node != nullptr; }
};

// Shape/dtype/device of one forward output, to build a zero gradient when none arrives.
struct OutputMeta {
  Shape shape;
  DType dtype;
  Device device;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  virtual std::string name() const = 0;
  // grads: one per forward output (all defined). Returns one gradient per next edge;
  // an undefined entry means "no gradient".
  virtual Tensors apply(Tensors&& grads) = 0;
  // Frees saved tensors once backward has run without retain_graph.
  virtual void release() {}
  // True when apply() is built from differentiable ops, so a backward pass with create_graph
  // (autograd::grad) may differentiate its gradients again. The engine runs any other node
  // without history there and marks its gradients as not differentiable a second time.
  virtual bool differentiable_backward() const { return false; }

  std::vector<Edge> next_edges;
  std::vector<OutputMeta> outputs;
  uint64_t sequence_nr;  // creation order: later nodes run first in backward
};

// The sequence_nr the next node will get: nodes created from now on have one at least as large.
uint64_t next_sequence_nr();

using BackwardFn = std::function<Tensors(const Tensors& grads)>;

// What a backward formula promises. first_order: its gradients are right, but it may use native
// kernels or read saved tensors without their history. differentiable: it uses only
// differentiable ops, on its gradients and on inputs saved with save_with_history, so under
// create_graph its gradients carry a correct graph of their own (double backward).
enum class Backward { first_order, differentiable };

// A node whose backward is a closure. Closures capture the tensors they need through
// `save(t)` (a SavedTensor) and read them with unpack(), so the graph holds no reference
// cycles and an in-place change after the forward is caught.
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, BackwardFn fn, Backward kind = Backward::first_order)
      : name_(std::move(name)), fn_(std::move(fn)), kind_(kind) {}
  std::string name() const override { return name_; }
  Tensors apply(Tensors&& grads) override;
  void release() override { fn_ = nullptr; }
  bool differentiable_backward() const override { return kind_ == Backward::differentiable; }

 private:
  std::string name_;
  BackwardFn fn_;
  Backward kind_;
};

// Sink for a leaf: adds the incoming gradient into leaf.grad, then runs its hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  std::string name() const override { return "AccumulateGrad"; }
  Tensors apply(Tensors&& grads) override;
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

// True when grad mode is on and any defined input requires grad.
bool needs_grad(std::initializer_list<Tensor> inputs);
bool needs_grad(const Tensors& inputs);
// The edge through which a gradient for `t` flows (its grad_fn, its accumulator, or none).
Edge gradient_edge(const Tensor& t);
// Attaches a new FunctionNode to `outputs`, with one next edge per input.
void record(std::string name, const Tensors& inputs, const Tensors& outputs, BackwardFn fn,
            Backward kind = Backward::first_order);
// A tensor saved for backward: the same data without history (no cycle output -> node ->
// output), and its storage's version when saved. Like PyTorch, unpack() refuses it once an
// in-place op has written into that storage (through it or any view) since.
class SavedTensor {
 public:
  SavedTensor() = default;
  // keep_history: also hold `t` itself, history included (see save_with_history).
  explicit SavedTensor(const Tensor& t, bool keep_history = false);
  bool defined() const { return tensor_.defined(); }
  // The saved tensor (undefined when none was saved). An ember::Error naming the node whose
  // backward is running, the tensor's shape and both versions when it was modified in place.
  // Under grad mode (a backward with create_graph) one saved with its history comes back with
  // it, and one saved with save_output comes back as output `output_nr` of the running node.
  Tensor unpack() const;

 private:
  friend SavedTensor save_output(const Tensor& t, uint32_t output_nr);
  // The saved output with the running node as its grad_fn.
  Tensor output_of_running_node() const;

  Tensor tensor_;
  Tensor with_history_;  // `t` itself, for save_with_history when it requires grad
  uint64_t version_ = 0;
  bool is_output_ = false;  // saved with save_output
  uint32_t output_nr_ = 0;
};
inline SavedTensor save(const Tensor& t) { return SavedTensor(t); }
// For an input of the node being recorded, never one of its outputs (the output would hold its
// own node: a reference cycle). A differentiable backward formula (Backward::differentiable)
// saves its inputs this way so its gradients are differentiable in them too.
inline SavedTensor save_with_history(const Tensor& t) { return SavedTensor(t, /*keep_history=*/true); }
// Output `output_nr` of the node being recorded, saved for that node's own backward formula.
// Holding it with its history would be a cycle, so it is held without; under grad mode unpack()
// (which the formula calls while its node runs) gives it back as a fresh alias whose grad_fn is
// that node, so a differentiable formula may use the output (exp, tanh, sigmoid read theirs).
inline SavedTensor save_output(const Tensor& t, uint32_t output_nr = 0) {
  SavedTensor s(t);
  s.is_output_ = s.defined();
  s.output_nr_ = output_nr;
  return s;
}

}  // namespace ember::autograd
