#include "autograd/node.h"

#include <string>
#include <vector>

#include "core/error.h"
#include "core/grad_mode.h"
#include "core/native/copy.h"

namespace ember::autograd {
namespace {
std::atomic<uint64_t> sequence_counter{0};

// The node whose backward runs on this thread, for SavedTensor's error.
thread_local const Node* running_node = nullptr;

struct RunningNodeScope {
  const Node* previous;
  explicit RunningNodeScope(const Node* n) : previous(running_node) { running_node = n; }
  ~RunningNodeScope() { running_node = previous; }
  RunningNodeScope(const RunningNodeScope&) = delete;
  RunningNodeScope& operator=(const RunningNodeScope&) = delete;
};

bool still_registered(const TensorImpl& leaf, uint64_t id) {
  for (const PostAccumulateHook& h : leaf.post_accumulate_hooks)
    if (h.id == id) return true;
  return false;
}
}

Node::Node() : sequence_nr(sequence_counter++) {}

uint64_t next_sequence_nr() { return sequence_counter.load(); }

Tensors FunctionNode::apply(Tensors&& grads) {
  EMBER_CHECK(fn_ != nullptr, "backward: ", name_, " was already run and its saved tensors freed; "
              "call backward(grad, /*retain_graph=*/true) the first time to backward twice");
  RunningNodeScope running(this);
  return fn_(grads);
}

SavedTensor::SavedTensor(const Tensor& t, bool keep_history) {
  if (!t.defined()) return;
  tensor_ = t.detach();
  if (keep_history && t.requires_grad()) with_history_ = t;
  version_ = t.version();
}

Tensor SavedTensor::unpack() const {
  if (tensor_.defined() && tensor_.version() != version_) {
    EMBER_FAIL("one of the variables needed for gradient computation has been modified by an inplace operation: ",
               running_node ? running_node->name() : std::string("a backward formula"), " saved a tensor of shape ",
               tensor_.shape(), " at version ", version_, ", and it is now at version ", tensor_.version(),
               "; clone() it before the in-place change, or make the change after backward");
  }
  if (!GradMode::is_enabled()) return tensor_;
  if (is_output_) return output_of_running_node();
  return with_history_.defined() ? with_history_ : tensor_;
}

Tensor SavedTensor::output_of_running_node() const {
  EMBER_CHECK(running_node != nullptr, "backward: a saved output was unpacked under grad mode outside the "
              "backward formula of the node that produced it");
  const std::shared_ptr<Node> node = std::const_pointer_cast<Node>(running_node->shared_from_this());
  EMBER_CHECK(output_nr_ < node->outputs.size() && node->outputs[output_nr_].shape == tensor_.shape(),
              "backward: ", node->name(), " unpacked a saved output of shape ", tensor_.shape(),
              " that is not its output ", output_nr_);
  Tensor alias = tensor_.detach();
  TensorImpl* impl = alias.impl();
  impl->grad_fn = node;
  impl->output_nr = output_nr_;
  impl->requires_grad = true;
  return alias;
}

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {
  sequence_nr = UINT64_MAX;  // run as soon as ready, so hooks fire early
  outputs.push_back({leaf_->shape, leaf_->dtype, leaf_->device()});
}

Tensors AccumulateGrad::apply(Tensors&& grads) {
  Tensor g = grads.at(0);
  Tensor leaf(leaf_);
  EMBER_CHECK(g.shape() == leaf.shape(), "backward: gradient of shape ", g.shape(),
              " for a leaf of shape ", leaf.shape());
  if (g.dtype() != leaf.dtype()) g = native::to_dtype(g, leaf.dtype());
  if (g.device() != leaf.device()) g = native::to_device(g, leaf.device());
  if (!leaf_->grad) {
    // Take ownership of the incoming buffer when nobody else can see it; otherwise copy so
    // later in-place accumulation never writes into another tensor.
    const bool exclusive = g.is_contiguous() && g.impl_ptr().use_count() <= 2 &&
                           g.impl()->storage.use_count() == 1;
    leaf_->grad = exclusive ? g.detach().impl_ptr() : native::clone(g).impl_ptr();
  } else {
    Tensor acc(leaf_->grad);
    NoGradGuard no_grad;
    acc.add_(g);
  }
  // A snapshot, so a hook may register or remove hooks (itself included) while they run.
  const std::vector<PostAccumulateHook> hooks = leaf_->post_accumulate_hooks;
  for (const PostAccumulateHook& hook : hooks) {
    if (!hook.sparse && still_registered(*leaf_, hook.id)) (*hook.fn)(leaf);
  }
  return {};
}

bool needs_grad(std::initializer_list<Tensor> inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const auto& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

bool needs_grad(const Tensors& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const auto& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  TensorImpl* impl = t.impl();
  if (impl->grad_fn) return {impl->grad_fn, impl->output_nr};
  auto acc = impl->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    impl->grad_accumulator = acc;
  }
  return {acc, 0};
}

void record(std::string name, const Tensors& inputs, const Tensors& outputs, BackwardFn fn, Backward kind) {
  auto node = std::make_shared<FunctionNode>(std::move(name), std::move(fn), kind);
  node->next_edges.reserve(inputs.size());
  for (const auto& in : inputs) node->next_edges.push_back(gradient_edge(in));
  for (size_t i = 0; i < outputs.size(); ++i) {
    TensorImpl* o = outputs[i].impl();
    node->outputs.push_back({o->shape, o->dtype, o->device()});
    o->grad_fn = node;
    o->output_nr = uint32_t(i);
    o->requires_grad = true;
  }
}

}  // namespace ember::autograd
