#include "distributed/fsdp.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <iterator>
#include <map>

#include "autograd/engine.h"
#include "autograd/node.h"
#include "core/autocast.h"
#include "core/factory.h"
#include "core/grad_mode.h"
#include "distributed/model_replica.h"
#include "nn/models/pretrained_model.h"
#include "optim/clip_grad.h"

namespace ember::distributed {

namespace {
// The entry's parameter-shaped window into a unit's flat buffer (weights or gradients).
Tensor entry_slot(const Tensor& flat, const FlatParamEntry& e) {
  const Shape shape = e.param.shape();
  return make_view(flat, shape, contiguous_strides(shape), e.offset);
}
}  // namespace

const char* sharding_strategy_name(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FULL_SHARD: return "FULL_SHARD";
    case ShardingStrategy::SHARD_GRAD_OP: return "SHARD_GRAD_OP";
    case ShardingStrategy::SHARD_OPTIMIZER: return "SHARD_OPTIMIZER";
    case ShardingStrategy::NO_SHARD: return "NO_SHARD";
  }
  return "?";
}

ShardingStrategy parse_sharding_strategy(const std::string& name) {
  std::string up;
  for (char c : name) up.push_back(char(std::toupper(static_cast<unsigned char>(c))));
  for (auto s : {ShardingStrategy::FULL_SHARD, ShardingStrategy::SHARD_GRAD_OP, ShardingStrategy::SHARD_OPTIMIZER,
                 ShardingStrategy::NO_SHARD})
    if (up == sharding_strategy_name(s)) return s;
  const bool numeric = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) { return std::isdigit(c); });
  EMBER_CHECK(!numeric, "sharding strategy '", name, "': give the name, not a number (Accelerate's 1 is FULL_SHARD, "
              "DeepSpeed's stage 1 is SHARD_OPTIMIZER): stage 1 = SHARD_OPTIMIZER, stage 2 = SHARD_GRAD_OP, "
              "stage 3 = FULL_SHARD, no sharding = NO_SHARD");
  EMBER_FAIL("unknown sharding strategy '", name, "'; expected FULL_SHARD, SHARD_GRAD_OP, SHARD_OPTIMIZER or NO_SHARD");
}

// One unit's buffers. flat_param holds the parameters (each one a view into it); shard_views
// are this rank's pieces of them, what the optimizer steps. Under FULL_SHARD they view `shard`
// instead, and flat_param's memory exists only while the unit is gathered.
struct FullyShardedDataParallel::Unit {
  enum class State { Gathered, Gathering, Released };
  Tensor flat_param;               // [padded]: f32, or FULL_SHARD's param_dtype
  Tensor shard;                    // FULL_SHARD: f32 [shard_numel], the master copy
  State state = State::Gathered;
  std::shared_ptr<Work> gather_work;
  Tensor gather_source;            // the shard cast to param_dtype, read by the gather in flight
  Tensor full_f32;                 // inside summon_full_params under a lower param_dtype
  nn::Module* module = nullptr;    // FULL_SHARD: the wrapped module whose hooks gather
  Tensor flat_grad;                // f32 [padded]: kept across steps under SHARD_OPTIMIZER, else per pass
  std::vector<Tensor> shard_views; // one per parameter, 1-D, maybe empty
  std::vector<int64_t> view_offset;  // the view's first element within the owned range
  std::vector<bool> ready;
  size_t pending = 0;
  Tensor reduced;                  // the averaged owned range, in reduce_dtype
  std::shared_ptr<Work> work;
  Tensor in_flight;                // what the collective reads, kept alive until it finished
};

// Ties the end-of-backward callback to its pass (as the Reducer's does): a pass the engine
// dropped without finishing drains its collectives and starts clean next time.
struct FullyShardedDataParallel::PassToken {
  std::weak_ptr<FullyShardedDataParallel> owner;
  bool finished = false;
  ~PassToken() {
    if (finished) return;
    if (auto f = owner.lock()) f->abandon_pass();
  }
};

std::shared_ptr<FullyShardedDataParallel> FullyShardedDataParallel::create(std::shared_ptr<nn::Module> model,
                                                                           std::shared_ptr<ProcessGroup> pg,
                                                                           FSDPOptions options) {
  std::shared_ptr<FullyShardedDataParallel> f(new FullyShardedDataParallel(std::move(model), std::move(pg), options));
  f->install_hooks();
  return f;
}

std::shared_ptr<FullyShardedDataParallel> shard_model(std::shared_ptr<nn::Module> model,
                                                      std::shared_ptr<ProcessGroup> pg, FSDPOptions options) {
  return FullyShardedDataParallel::create(std::move(model), std::move(pg), std::move(options));
}

FullyShardedDataParallel::FullyShardedDataParallel(std::shared_ptr<nn::Module> model, std::shared_ptr<ProcessGroup> pg,
                                                   FSDPOptions options)
    : model_(std::move(model)), pg_(std::move(pg)), options_(std::move(options)) {
  const char* who = "sharded data parallel";
  EMBER_CHECK(model_ != nullptr, who, ": model is null");
  EMBER_CHECK(pg_ != nullptr, who, ": process group is null");
  const auto& pd = options_.mixed_precision.param_dtype;
  EMBER_CHECK(!pd || *pd == DType::f32 || *pd == DType::bf16 || *pd == DType::f16, who,
              ": param_dtype must be f32, bf16 or f16, got ", pd ? dtype_name(*pd) : "");
  EMBER_CHECK(!pd || *pd == DType::f32 || full_shard(), who, ": param_dtype ", pd ? dtype_name(*pd) : "", " under ",
              sharding_strategy_name(options_.sharding_strategy),
              ": only FULL_SHARD gathers a lower-precision compute copy; the replicated strategies keep f32 "
              "parameters, so run their forward under autocast (AutocastGuard, or the Accelerator's "
              "mixed_precision) for bf16/f16 compute");
  const DType rd = options_.mixed_precision.reduce_dtype;
  EMBER_CHECK(rd == DType::f32 || rd == DType::bf16 || rd == DType::f16, who, ": reduce_dtype must be f32, bf16 or "
              "f16, got ", dtype_name(rd));
  if (options_.activation_checkpointing) {
    // Accelerate applies checkpointing to the wrapped layers; the models that support it wrap
    // exactly those (every encoder layer), so their own switch does it.
    auto* pretrained = dynamic_cast<nn::PretrainedModel*>(model_.get());
    EMBER_CHECK(pretrained && pretrained->supports_gradient_checkpointing(), who, ": activation_checkpointing: ",
                model_->type_name(), " has no gradient_checkpointing_enable(); wrap its blocks' forward in "
                "ember::checkpoint (autograd/checkpoint.h) instead");
    pretrained->gradient_checkpointing_enable();
  }
  for (const auto& [name, t] : model_->named_parameters())
    EMBER_CHECK(!t.row_sparse_grad(), who, ": parameter '", name, "' takes row-sparse gradients (an Embedding "
                "built with sparse = true); sharded strategies reduce dense flat gradients, so turn sparse off "
                "(Embedding::set_sparse(false)) or train it under DistributedDataParallel");
  verify_same_model_on_all_ranks(*model_, *pg_, who);
  std::vector<Tensor> state;
  for (auto& [name, t] : model_->named_parameters()) state.push_back(t);
  for (auto& [name, t] : model_->named_buffers()) state.push_back(t);
  broadcast_from_rank0(*pg_, state);
  layouts_ = plan_units(*model_, options_, pg_->size());
  build_units();
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  remove_hooks();
  for (auto& u : units_)
    for (auto* w : {&u->work, &u->gather_work}) {
      if (!*w) continue;
      try {
        (*w)->wait();
      } catch (...) {
      }
    }
}

std::pair<int64_t, int64_t> FullyShardedDataParallel::owned_range(const UnitLayout& u) const {
  if (options_.sharding_strategy == ShardingStrategy::NO_SHARD) return {0, u.padded_numel};
  const int64_t r = pg_->rank();
  return {r * u.shard_numel, (r + 1) * u.shard_numel};
}

DType FullyShardedDataParallel::compute_dtype() const {
  return full_shard() ? options_.mixed_precision.param_dtype.value_or(DType::f32) : DType::f32;
}

void FullyShardedDataParallel::bind_parameters(size_t u, const Tensor& flat) {
  for (const FlatParamEntry& e : layouts_[u].params) {
    Tensor param = e.param;
    nn::replace_data(param, entry_slot(flat, e));
  }
}

void FullyShardedDataParallel::build_units() {
  NoGradGuard no_grad;
  for (const UnitLayout& layout : layouts_) {
    auto unit = std::make_unique<Unit>();
    unit->flat_param = zeros({layout.padded_numel});
    const auto [lo, hi] = owned_range(layout);
    for (size_t i = 0; i < layout.params.size(); ++i) {
      const FlatParamEntry& e = layout.params[i];
      Tensor param = e.param;
      Tensor slot = entry_slot(unit->flat_param, e);
      slot.copy_(param);
      param.set_grad(Tensor());
      nn::replace_data(param, slot);  // the parameter keeps its identity, now inside the flat buffer
      const auto [first, len] = layout.overlap(i, lo, hi);
      unit->view_offset.push_back(len ? e.offset + first - lo : 0);
    }
    if (full_shard()) unit->shard = unit->flat_param.narrow(0, lo, hi - lo).clone();
    for (size_t i = 0; i < layout.params.size(); ++i) {
      const int64_t len = layout.overlap(i, lo, hi).second;
      Tensor view = full_shard() ? make_view(unit->shard, {len}, {1}, unit->view_offset[i])
                                 : make_view(unit->flat_param, {len}, {1}, len ? lo + unit->view_offset[i] : 0);
      view = view.detach();
      view.requires_grad_(true);
      unit->shard_views.push_back(view);
    }
    if (full_shard()) {
      if (compute_dtype() != DType::f32) {
        // The parameters become views of a param_dtype buffer: what forward and backward see.
        unit->flat_param = make_tensor({layout.padded_numel}, compute_dtype(), Device::cpu());
        bind_parameters(units_.size(), unit->flat_param);
      }
      unit->flat_param.impl()->storage->release_memory();
      unit->state = Unit::State::Released;
    }
    unit->ready.assign(layout.params.size(), false);
    unit->pending = layout.params.size();
    if (options_.sharding_strategy == ShardingStrategy::SHARD_OPTIMIZER) unit->flat_grad = zeros({layout.padded_numel});
    units_.push_back(std::move(unit));
  }
  // Reduce the units whose gradients come first in backward first: the last layers.
  for (size_t u = units_.size(); u-- > 0;) launch_order_.push_back(u);
}

void FullyShardedDataParallel::install_hooks() {
  std::weak_ptr<FullyShardedDataParallel> weak = weak_from_this();
  // Before the model's forward, gather what the last optimizer step updated.
  hooks_.push_back(model_->register_forward_pre_hook([weak](nn::Module&) {
    auto f = weak.lock();
    if (!f) return;
    if (f->full_shard() && !autograd::in_backward()) {
      if (!f->recording_.empty()) f->forward_order_ = f->recording_;
      f->recording_.clear();
    }
    f->sync_parameters();
  }));
  if (full_shard()) {
    std::map<std::string, nn::Module*> modules;
    for (auto& [path, m] : model_->named_modules()) modules[path] = m;
    for (size_t u = 0; u < layouts_.size(); ++u) {
      auto it = modules.find(layouts_[u].name);
      EMBER_CHECK(it != modules.end(), "sharded data parallel: unit '", layouts_[u].display_name(),
                  "' names no module of the model");
      units_[u]->module = it->second;
      hooks_.push_back(it->second->register_forward_pre_hook([weak, u](nn::Module&) {
        if (auto f = weak.lock()) f->pre_forward(u);
      }));
      hooks_.push_back(it->second->register_forward_hook([weak, u](nn::Module&, const Tensor& out) {
        auto f = weak.lock();
        return f ? f->post_forward(u, out) : out;
      }));
    }
  }
  for (size_t u = 0; u < layouts_.size(); ++u)
    for (size_t i = 0; i < layouts_[u].params.size(); ++i)
      hooks_.push_back(layouts_[u].params[i].param.register_post_accumulate_grad_hook([weak, u, i](const Tensor&) {
        if (auto f = weak.lock()) f->on_gradient_ready(u, i);
      }));
}

void FullyShardedDataParallel::remove_hooks() {
  for (RemovableHandle& h : hooks_) h.remove();
  hooks_.clear();
}

std::vector<Tensor> FullyShardedDataParallel::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> FullyShardedDataParallel::named_parameters() const {
  std::vector<std::pair<int64_t, std::pair<std::string, Tensor>>> all;
  for (size_t u = 0; u < layouts_.size(); ++u)
    for (size_t i = 0; i < layouts_[u].params.size(); ++i)
      all.push_back({layouts_[u].params[i].model_index, {layouts_[u].params[i].name, units_[u]->shard_views[i]}});
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [k, entry] : all) out.push_back(std::move(entry));
  return out;
}

Tensor FullyShardedDataParallel::shard_of(const Tensor& param) const {
  if (!param.defined()) return Tensor();
  for (size_t u = 0; u < layouts_.size(); ++u)
    for (size_t i = 0; i < layouts_[u].params.size(); ++i)
      if (layouts_[u].params[i].param.impl() == param.impl()) return units_[u]->shard_views[i];
  return Tensor();
}

std::vector<ShardPiece> FullyShardedDataParallel::shard_pieces() const {
  std::vector<std::pair<int64_t, ShardPiece>> all;
  for (size_t u = 0; u < layouts_.size(); ++u) {
    const auto [lo, hi] = owned_range(layouts_[u]);
    for (size_t i = 0; i < layouts_[u].params.size(); ++i) {
      const FlatParamEntry& e = layouts_[u].params[i];
      const auto [first, len] = layouts_[u].overlap(i, lo, hi);
      all.push_back({e.model_index, ShardPiece{e.name, e.param.shape(), first, len, units_[u]->shard_views[i]}});
    }
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<ShardPiece> out;
  for (auto& [k, piece] : all) out.push_back(std::move(piece));
  return out;
}

std::vector<std::pair<std::string, Tensor>> FullyShardedDataParallel::full_state_dict() {
  auto full = summon_full_params(false);
  NoGradGuard no_grad;
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, t] : model_->state_dict()) out.push_back({name, t.clone()});
  return out;
}

std::vector<Tensor> FullyShardedDataParallel::sharded(const std::vector<Tensor>& params) const {
  std::vector<Tensor> out;
  for (const Tensor& p : params) {
    Tensor found = shard_of(p);
    EMBER_CHECK(found.defined(), "sharded data parallel: sharded(): a tensor of shape ", p.shape(),
                " is not a trainable parameter of the wrapped model");
    out.push_back(found);
  }
  return out;
}

std::vector<std::string> FullyShardedDataParallel::unit_names() const {
  std::vector<std::string> out;
  for (const auto& l : layouts_) out.push_back(l.display_name());
  return out;
}

bool FullyShardedDataParallel::reshards_after_forward(size_t u) const {
  return !layouts_[u].name.empty() && options_.reshard_after_forward.value_or(true);
}

bool FullyShardedDataParallel::unit_gathered(size_t u) const {
  EMBER_CHECK(u < units_.size(), "sharded data parallel: unit ", u, " of ", units_.size());
  return units_[u]->state == Unit::State::Gathered;
}

void FullyShardedDataParallel::gather(size_t u) {
  Unit& unit = *units_[u];
  if (unit.state != Unit::State::Released) return;
  NoGradGuard no_grad;
  unit.flat_param.impl()->storage->restore_memory();
  try {
    // Under a lower param_dtype the shard is cast first: the traffic is in param_dtype too.
    unit.gather_source = compute_dtype() == DType::f32 ? unit.shard : unit.shard.to(compute_dtype());
    unit.gather_work = pg_->allgather_into(unit.flat_param, unit.gather_source);
  } catch (...) {
    unit.gather_source = Tensor();
    unit.flat_param.impl()->storage->release_memory();
    throw;
  }
  unit.state = Unit::State::Gathering;
  bytes_gathered_ += layouts_[u].padded_numel * int64_t(dtype_size(compute_dtype()));
}

void FullyShardedDataParallel::ensure_gathered(size_t u) {
  Unit& unit = *units_[u];
  if (unit.state == Unit::State::Gathered) return;
  gather(u);
  std::shared_ptr<Work> w = std::move(unit.gather_work);
  w->wait();
  unit.gather_source = Tensor();
  unit.state = Unit::State::Gathered;
}

void FullyShardedDataParallel::reshard(size_t u) {
  Unit& unit = *units_[u];
  if (!full_shard() || unit.state == Unit::State::Released) return;
  if (std::shared_ptr<Work> w = std::move(unit.gather_work)) {
    // The collective writes into the memory: it must be done before the memory goes back.
    unit.state = Unit::State::Gathered;
    w->wait();
    unit.gather_source = Tensor();
  }
  unit.flat_param.impl()->storage->release_memory();
  unit.state = Unit::State::Released;
}

std::optional<size_t> FullyShardedDataParallel::neighbour(size_t u, int step) const {
  std::vector<size_t> layout_order;
  const std::vector<size_t>* order = &forward_order_;
  if (forward_order_.empty()) {
    for (size_t k = 0; k < units_.size(); ++k) layout_order.push_back(k);
    order = &layout_order;
  }
  auto it = std::find(order->begin(), order->end(), u);
  if (it == order->end()) return std::nullopt;
  const auto at = std::distance(order->begin(), it) + step;
  if (at < 0 || at >= std::ssize(*order)) return std::nullopt;
  return (*order)[size_t(at)];
}

void FullyShardedDataParallel::pre_forward(size_t u) {
  const DType cd = compute_dtype();
  // The inputs stay f32 (no cast of forward inputs): autocast is what lets f32 activations
  // meet param_dtype weights, so without it the first op would fail on mixed dtypes.
  const bool under_autocast = autocast_enabled(DeviceType::CPU) && autocast_dtype(DeviceType::CPU) == cd;
  EMBER_CHECK(cd == DType::f32 || autograd::in_backward() || under_autocast,
              "sharded data parallel: unit '", layouts_[u].display_name(), "' computes in param_dtype ",
              dtype_name(cd), ": run the forward under AutocastGuard(DeviceType::CPU, ", dtype_name(cd),
              ") (the Accelerator's mixed_precision \"", cd == DType::bf16 ? "bf16" : "fp16", "\" does)");
  ensure_gathered(u);
  if (autograd::in_backward()) {
    // A checkpointed block recomputing its forward: backward is at this unit.
    if (options_.backward_prefetch == BackwardPrefetch::BACKWARD_PRE)
      if (auto prev = neighbour(u, -1)) gather(*prev);
    return;
  }
  if (std::find(recording_.begin(), recording_.end(), u) == recording_.end()) recording_.push_back(u);
  if (options_.forward_prefetch)
    if (auto next = neighbour(u, +1)) gather(*next);
}

Tensor FullyShardedDataParallel::post_forward(size_t u, const Tensor& out) {
  if (autograd::in_backward()) return out;  // a recompute inside backward: backward needs the parameters
  const bool grad = GradMode::is_enabled();
  // Without grad no backward follows, so even the root frees its parameters.
  if (!grad || reshards_after_forward(u)) reshard(u);
  if (grad && out.defined() && out.requires_grad()) return attach_pre_backward(u, out);
  return out;
}

// The output passes through a node whose backward runs before any backward of the unit: it
// gathers the unit again (and prefetches the one backward reaches next).
Tensor FullyShardedDataParallel::attach_pre_backward(size_t u, const Tensor& out) {
  std::weak_ptr<FullyShardedDataParallel> weak = weak_from_this();
  auto node = std::make_shared<autograd::FunctionNode>("FSDPPreBackward", [weak, u](const autograd::Tensors& grads) {
    if (auto f = weak.lock()) f->pre_backward(u);
    return grads;
  });
  node->next_edges.push_back(autograd::gradient_edge(out));
  Tensor o = out.detach();
  TensorImpl* impl = o.impl();
  impl->grad_fn = node;
  impl->output_nr = 0;
  impl->requires_grad = true;
  node->outputs.push_back({o.shape(), o.dtype(), o.device()});
  return o;
}

void FullyShardedDataParallel::pre_backward(size_t u) {
  if (!pass_active_) begin_pass();
  ensure_gathered(u);
  if (options_.backward_prefetch == BackwardPrefetch::BACKWARD_PRE)
    if (auto prev = neighbour(u, -1)) gather(*prev);
}

void FullyShardedDataParallel::on_gradient_ready(size_t u, size_t i) {
  if (!sync_) return;
  if (!pass_active_) begin_pass();
  Unit& unit = *units_[u];
  const FlatParamEntry& e = layouts_[u].params[i];
  EMBER_CHECK(!unit.ready[i], "sharded data parallel: parameter '", e.name, "' was marked ready twice in one "
              "backward pass; a parameter accumulates one gradient per backward pass");
  unit.ready[i] = true;
  NoGradGuard no_grad;
  if (!unit.flat_grad.defined()) unit.flat_grad = zeros({layouts_[u].padded_numel});
  Tensor param = e.param;
  Tensor slot = entry_slot(unit.flat_grad, e);
  Tensor g = param.grad();
  const bool is_slot = g.defined() && g.impl()->storage == slot.impl()->storage && g.storage_offset() == e.offset;
  if (!is_slot) slot.copy_(g);
  if (options_.sharding_strategy == ShardingStrategy::SHARD_OPTIMIZER) {
    // The full gradient stays, as the slot: the next pass accumulates straight into it.
    if (!is_slot) param.set_grad(slot);
  } else {
    param.set_grad(Tensor());  // only the shard is kept
  }
  if (--unit.pending == 0) launch_ready_units();
}

void FullyShardedDataParallel::begin_pass() {
  auto token = std::make_shared<PassToken>();
  token->owner = weak_from_this();
  autograd::queue_callback([token] {
    token->finished = true;
    if (auto f = token->owner.lock()) f->finish_pass();
  });
  pass_active_ = true;
}

void FullyShardedDataParallel::launch_ready_units() {
  while (next_launch_ < launch_order_.size() && units_[launch_order_[next_launch_]]->pending == 0)
    launch(launch_order_[next_launch_++]);
}

void FullyShardedDataParallel::launch(size_t u) {
  Unit& unit = *units_[u];
  const UnitLayout& layout = layouts_[u];
  const DType rd = options_.mixed_precision.reduce_dtype;
  Tensor send = rd == DType::f32 ? unit.flat_grad : unit.flat_grad.to(rd);
  if (options_.sharding_strategy == ShardingStrategy::NO_SHARD) {
    if (send.impl() == unit.flat_grad.impl()) send = send.clone();  // flat_grad may be read again below
    unit.work = pg_->allreduce(send, ReduceOp::Avg);
    unit.reduced = send;
  } else {
    unit.reduced = make_tensor({layout.shard_numel}, rd, Device::cpu());
    unit.work = pg_->reduce_scatter(unit.reduced.view({1, layout.shard_numel}),
                                    send.view({pg_->size(), layout.shard_numel}), ReduceOp::Avg);
  }
  unit.in_flight = send;
  if (options_.sharding_strategy != ShardingStrategy::SHARD_OPTIMIZER) unit.flat_grad = Tensor();  // in_flight holds it
  stats_.buckets_reduced++;
  stats_.bytes_reduced += layout.padded_numel * int64_t(dtype_size(rd));
  reshard(u);  // FULL_SHARD: every gradient of the unit exists, so its backward is over
  // At most two reductions in flight, so their full-size gradient buffers do not pile up.
  launched_.push_back(u);
  while (launched_.size() > 2) {
    complete(launched_.front());
    launched_.erase(launched_.begin());
  }
}

void FullyShardedDataParallel::complete(size_t u) {
  NoGradGuard no_grad;
  Unit& unit = *units_[u];
  if (std::shared_ptr<Work> w = std::move(unit.work)) w->wait();
  Tensor reduced = unit.reduced.dtype() == DType::f32 ? unit.reduced : unit.reduced.to(DType::f32);
  for (size_t i = 0; i < unit.shard_views.size(); ++i) {
    Tensor& view = unit.shard_views[i];
    if (view.numel() == 0) continue;
    Tensor g = reduced.narrow(0, unit.view_offset[i], view.numel());
    if (view.grad().defined())
      Tensor(view.grad()).add_(g);
    else
      view.set_grad(g);
  }
  unit.reduced = Tensor();
  unit.in_flight = Tensor();
  if (options_.sharding_strategy == ShardingStrategy::SHARD_OPTIMIZER)
    unit.flat_grad.zero_();  // the parameters' .grad: zero again, ready to accumulate
  else
    unit.flat_grad = Tensor();
}

void FullyShardedDataParallel::finish_pass() {
  using Clock = std::chrono::steady_clock;
  NoGradGuard no_grad;
  try {
    if (sync_) {
      // Parameters without a gradient in this pass contribute what they accumulated under
      // no_sync, or zeros: every rank reduces every unit, whatever its own graph used.
      for (size_t u = 0; u < units_.size(); ++u) {
        Unit& unit = *units_[u];
        for (size_t i = 0; i < unit.ready.size(); ++i) {
          if (unit.ready[i]) continue;
          if (layouts_[u].params[i].param.grad().defined()) {
            on_gradient_ready(u, i);
            continue;
          }
          unit.ready[i] = true;
          if (!unit.flat_grad.defined()) unit.flat_grad = zeros({layouts_[u].padded_numel});
          --unit.pending;
        }
      }
      launch_ready_units();
      const auto wait_start = Clock::now();
      for (size_t u : launched_) complete(u);
      launched_.clear();
      const double exposed = std::chrono::duration<double, std::milli>(Clock::now() - wait_start).count();
      stats_.steps++;
      stats_.last_exposed_ms = exposed;
      stats_.total_exposed_ms += exposed;
      parameters_stale_ = true;
    }
    for (size_t u = 0; u < units_.size(); ++u) reshard(u);
  } catch (...) {
    abandon_pass();
    throw;
  }
  reset_pass_state();
}

void FullyShardedDataParallel::abandon_pass() noexcept {
  for (auto& u : units_) {
    if (!u->work) continue;
    try {
      u->work->wait();
    } catch (...) {
    }
  }
  for (size_t k = 0; k < units_.size(); ++k) {
    Unit& u = *units_[k];
    u.reduced = Tensor();
    u.in_flight = Tensor();
    if (options_.sharding_strategy != ShardingStrategy::SHARD_OPTIMIZER) u.flat_grad = Tensor();
    try {
      reshard(k);
    } catch (...) {
    }
  }
  reset_pass_state();
}

void FullyShardedDataParallel::reset_pass_state() {
  for (auto& u : units_) {
    std::fill(u->ready.begin(), u->ready.end(), false);
    u->pending = u->ready.size();
    u->work.reset();
  }
  next_launch_ = 0;
  launched_.clear();
  pass_active_ = false;
}

void FullyShardedDataParallel::sync_parameters() {
  if (full_shard() || !parameters_stale_) return;  // FULL_SHARD gathers per unit, from the shards
  parameters_stale_ = false;
  // Without sharding every rank stepped every element itself.
  if (options_.sharding_strategy == ShardingStrategy::NO_SHARD || pg_->size() == 1) return;
  NoGradGuard no_grad;
  const int r = pg_->rank();
  // Every unit's gather in flight at once, each straight into its flat buffer (this rank's own
  // slice is the input, gathered in place).
  std::vector<std::shared_ptr<Work>> works;
  for (size_t u = 0; u < units_.size(); ++u) {
    const int64_t s = layouts_[u].shard_numel;
    works.push_back(pg_->allgather_into(units_[u]->flat_param, units_[u]->flat_param.narrow(0, r * s, s)));
    bytes_gathered_ += layouts_[u].padded_numel * 4;
  }
  for (auto& w : works) w->wait();
}

double FullyShardedDataParallel::clip_grad_norm_(double max_norm, double norm_type, bool error_if_nonfinite) {
  std::vector<Tensor> grads;
  for (auto& u : units_)
    for (auto& v : u->shard_views) grads.push_back(v.grad());
  double partial = optim::accumulate_grad_norm(grads, norm_type);
  const bool sharded = options_.sharding_strategy != ShardingStrategy::NO_SHARD && pg_->size() > 1;
  if (sharded) {
    Tensor t = from_vector<double>({partial});
    pg_->allreduce(t, std::isinf(norm_type) ? ReduceOp::Max : ReduceOp::Sum)->wait();
    partial = t.to_vector<double>()[0];
  }
  const double total = optim::finish_grad_norm(partial, norm_type);
  optim::scale_grads_to_norm(grads, max_norm, total, error_if_nonfinite);
  return total;
}

FullyShardedDataParallel::FullParamsGuard::FullParamsGuard(FullyShardedDataParallel& f, bool writeback)
    : f_(&f), writeback_(writeback) {
  EMBER_CHECK(!f.pass_active_, "sharded data parallel: summon_full_params inside a backward pass");
  f.sync_parameters();
  if (!f.full_shard()) return;
  if (f.compute_dtype() != DType::f32) {
    // The full values in f32, not the param_dtype copy: what the caller reads and writes back
    // is the master shards' precision. The parameters view the f32 copies until the guard ends.
    NoGradGuard no_grad;
    std::vector<std::shared_ptr<Work>> works;
    for (size_t u = 0; u < f.units_.size(); ++u) {
      f.reshard(u);
      Unit& unit = *f.units_[u];
      unit.full_f32 = zeros({f.layouts_[u].padded_numel});
      works.push_back(f.pg_->allgather_into(unit.full_f32, unit.shard));
      f.bytes_gathered_ += f.layouts_[u].padded_numel * 4;
    }
    for (auto& w : works) w->wait();
    for (size_t u = 0; u < f.units_.size(); ++u) f.bind_parameters(u, f.units_[u]->full_f32);
    return;
  }
  for (size_t u = 0; u < f.units_.size(); ++u)
    if (f.units_[u]->state != Unit::State::Gathered) released_.push_back(u);
  for (size_t u : released_) f.gather(u);
  for (size_t u : released_) f.ensure_gathered(u);
}

FullyShardedDataParallel::FullParamsGuard::~FullParamsGuard() {
  if (!f_ || !f_->full_shard()) return;
  NoGradGuard no_grad;
  const bool f32_copies = f_->compute_dtype() != DType::f32;
  try {
    if (writeback_)
      for (size_t u = 0; u < f_->units_.size(); ++u) {
        Unit& unit = *f_->units_[u];
        const int64_t s = f_->layouts_[u].shard_numel;
        const Tensor& full = f32_copies ? unit.full_f32 : unit.flat_param;
        unit.shard.copy_(full.narrow(0, int64_t(f_->pg_->rank()) * s, s));
      }
    if (f32_copies)
      for (size_t u = 0; u < f_->units_.size(); ++u) {
        f_->bind_parameters(u, f_->units_[u]->flat_param);
        f_->units_[u]->full_f32 = Tensor();
      }
    for (size_t u : released_) f_->reshard(u);
  } catch (...) {
    // A destructor must not throw; the units stay gathered and the next pass frees them.
  }
}

}  // namespace ember::distributed
