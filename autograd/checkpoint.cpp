#include "autograd/checkpoint.h"

#include <memory>
#include <unordered_set>
#include <utility>

#include "autograd/engine.h"
#include "autograd/node.h"
#include "core/autocast.h"
#include "core/error.h"
#include "core/grad_mode.h"
#include "core/rng.h"
#include "core/tensor_impl.h"

namespace ember {
namespace {

using Tensors = std::vector<Tensor>;
using VectorFn = std::function<Tensors(const Tensors&)>;

struct AutocastState {
  bool cpu_enabled, cuda_enabled;
  DType cpu_dtype, cuda_dtype;
};

AutocastState current_autocast() {
  return {autocast_enabled(DeviceType::CPU), autocast_enabled(DeviceType::CUDA), autocast_dtype(DeviceType::CPU),
          autocast_dtype(DeviceType::CUDA)};
}

// Sets the default generator's state and puts back the one it found, so the recompute replays
// the forward's random numbers and leaves the stream outside it untouched.
class GeneratorReplay {
 public:
  explicit GeneratorReplay(const GeneratorState& s) : outer_(default_generator().get_state()) {
    default_generator().set_state(s);
  }
  ~GeneratorReplay() { default_generator().set_state(outer_); }
  GeneratorReplay(const GeneratorReplay&) = delete;
  GeneratorReplay& operator=(const GeneratorReplay&) = delete;

 private:
  GeneratorState outer_;
};

bool differentiable(const Tensor& t) { return t.defined() && t.is_floating_point(); }

// What the backward needs: the function, its saved inputs, the replayed state.
struct Checkpointed {
  VectorFn fn;
  std::vector<autograd::SavedTensor> inputs;
  std::vector<bool> input_requires_grad;
  std::vector<size_t> output_slots;  // the node's output k is fn's output output_slots[k]
  size_t num_outputs = 0;
  GeneratorState rng;
  AutocastState autocast{};
};

// Nodes made by the recompute have sequence_nr >= first_nr (leaf accumulators are UINT64_MAX);
// one below it is history fn captured, whose backward belongs to the outer graph.
void refuse_captured_history(const Tensors& roots, uint64_t first_nr) {
  std::vector<autograd::Node*> stack;
  std::unordered_set<autograd::Node*> seen;
  auto visit = [&](autograd::Node* n) {
    if (n && seen.insert(n).second) stack.push_back(n);
  };
  for (const Tensor& r : roots) visit(r.impl()->grad_fn.get());
  while (!stack.empty()) {
    autograd::Node* n = stack.back();
    stack.pop_back();
    EMBER_CHECK(n->sequence_nr >= first_nr, "checkpoint: the checkpointed function uses a tensor with history that "
                "requires grad (produced by ", n->name(), ") without receiving it as an input; pass it in the "
                "inputs of checkpoint (or detach it) so its gradient flows through the outer graph");
    for (const autograd::Edge& e : n->next_edges) visit(e.node.get());
  }
}

Tensors recompute_and_backward(const Checkpointed& c, const Tensors& grads) {
  Tensors leaves;
  leaves.reserve(c.inputs.size());
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& saved = c.inputs[i].unpack();  // the version-counter check
    Tensor leaf = saved.defined() ? saved.detach() : Tensor();
    if (c.input_requires_grad[i]) leaf.requires_grad_();
    leaves.push_back(std::move(leaf));
  }
  Tensors outputs;
  uint64_t first_nr = 0;
  {
    GeneratorReplay rng(c.rng);
    EnableGradGuard grad;
    AutocastGuard cpu(DeviceType::CPU, c.autocast.cpu_dtype, c.autocast.cpu_enabled);
    AutocastGuard cuda(DeviceType::CUDA, c.autocast.cuda_dtype, c.autocast.cuda_enabled);
    first_nr = autograd::next_sequence_nr();
    outputs = c.fn(leaves);
  }
  EMBER_CHECK(outputs.size() == c.num_outputs, "checkpoint: the recompute returned ", outputs.size(),
              " outputs, the forward ", c.num_outputs, "; the checkpointed function must compute the same thing twice");
  Tensors roots, seeds;
  for (size_t k = 0; k < c.output_slots.size(); ++k) {
    const size_t j = c.output_slots[k];
    const Tensor& o = outputs[j];
    EMBER_CHECK(o.defined() && o.shape() == grads[k].shape(), "checkpoint: the recompute's output ", j, " has shape ",
                o.defined() ? o.shape() : Shape{}, " where the forward's had ", grads[k].shape(),
                "; the checkpointed function must compute the same thing twice");
    if (o.requires_grad()) {
      roots.push_back(o);
      seeds.push_back(grads[k]);
    }
  }
  refuse_captured_history(roots, first_nr);
  if (!roots.empty()) autograd::run_backward_within_pass(roots, seeds);
  Tensors input_grads(leaves.size());
  for (size_t i = 0; i < leaves.size(); ++i)
    if (c.input_requires_grad[i]) input_grads[i] = leaves[i].grad();
  return input_grads;
}

}  // namespace

std::vector<Tensor> checkpoint(std::function<std::vector<Tensor>(const std::vector<Tensor>&)> fn,
                               const std::vector<Tensor>& inputs) {
  EMBER_CHECK(fn != nullptr, "checkpoint: empty function");
  if (!GradMode::is_enabled()) return fn(inputs);

  auto c = std::make_shared<Checkpointed>();
  c->rng = default_generator().get_state();
  c->autocast = current_autocast();
  // Saved before fn runs, so an in-place write by fn itself is caught too.
  for (const Tensor& t : inputs) {
    c->inputs.emplace_back(t);
    c->input_requires_grad.push_back(t.defined() && t.requires_grad());
  }
  Tensors outputs;
  {
    NoGradGuard no_grad;
    outputs = fn(inputs);
  }
  c->num_outputs = outputs.size();

  auto node = std::make_shared<autograd::FunctionNode>(
      "CheckpointBackward", [c](const Tensors& grads) { return recompute_and_backward(*c, grads); });
  for (size_t j = 0; j < outputs.size(); ++j) {
    if (!differentiable(outputs[j])) continue;
    // A fresh TensorImpl, so an output that is an input (or another output) gets its own history.
    Tensor o = outputs[j].detach();
    TensorImpl* impl = o.impl();
    impl->grad_fn = node;
    impl->output_nr = uint32_t(c->output_slots.size());
    impl->requires_grad = true;
    node->outputs.push_back({o.shape(), o.dtype(), o.device()});
    c->output_slots.push_back(j);
    outputs[j] = std::move(o);
  }
  if (c->output_slots.empty()) return outputs;
  c->fn = std::move(fn);
  node->next_edges.reserve(inputs.size());
  for (const Tensor& t : inputs) node->next_edges.push_back(autograd::gradient_edge(t));
  return outputs;
}

Tensor checkpoint(std::function<Tensor(const Tensor&)> fn, const Tensor& input) {
  EMBER_CHECK(fn != nullptr, "checkpoint: empty function");
  return checkpoint([fn = std::move(fn)](const Tensors& in) { return Tensors{fn(in[0])}; }, Tensors{input})[0];
}

}  // namespace ember
