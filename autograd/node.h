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

class Node {
 public:
  Node();
  virtual ~Node() = default;
  virtual std::string name() const = 0;
  // grads: one per forward output (all defined). Returns one gradient per next edge;
  // an undefined entry means "no gradient".
  virtual Tensors apply(Tensors&& grads) = 0;
  // Frees saved tensors once backward has run without retain_graph.
  virtual void release() {}

  std::vector<Edge> next_edges;
  std::vector<OutputMeta> outputs;
  uint64_t sequence_nr;  // creation order: later nodes run first in backward
};

// The sequence_nr the next node will get: nodes created from now on have one at least as large.
uint64_t next_sequence_nr();

using BackwardFn = std::function<Tensors(const Tensors& grads)>;

// A node whose backward is a closure. Closures capture the tensors they need through
// `save(t)` (a SavedTensor) and read them with unpack(), so the graph holds no reference
// cycles and an in-place change after the forward is caught.
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, BackwardFn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  Tensors apply(Tensors&& grads) override;
  void release() override { fn_ = nullptr; }

 private:
  std::string name_;
  BackwardFn fn_;
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
void record(std::string name, const Tensors& inputs, const Tensors& outputs, BackwardFn fn);
// A tensor saved for backward: the same data without history (no cycle output -> node ->
// output), and its storage's version when saved. Like PyTorch, unpack() refuses it once an
// in-place op has written into that storage (through it or any view) since.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  bool defined() const { return tensor_.defined(); }
  // The saved tensor (undefined when none was saved). An ember::Error naming the node whose
  // backward is running, the tensor's shape and both versions when it was modified in place.
  const Tensor& unpack() const;

 private:
  Tensor tensor_;
  uint64_t version_ = 0;
};
inline SavedTensor save(const Tensor& t) { return SavedTensor(t); }

}  // namespace ember::autograd
