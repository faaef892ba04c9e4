// DistributedDataParallel: data parallelism over a ProcessGroup, the C++ twin of
// torch.nn.parallel.DistributedDataParallel. It does not wrap the model's type: it installs
// itself on the model's parameters, so the caller keeps using its own model (which is what
// Accelerator::prepare returns). Each rank runs forward/backward on its own batch; when
// backward ends, every .grad holds the average over ranks, so an optimizer step gives the
// same parameters on every rank as one process would get on the concatenated batch.
//
//   auto ddp = std::make_shared<DistributedDataParallel>(model, pg);   // keep it alive
//   for (...) {
//     ddp->sync_buffers();                  // or: auto out = ddp->forward(x);
//     loss(model->forward(x)).backward();   // gradients averaged over ranks here
//     opt.step(); opt.zero_grad();
//   }
//
// Construction is a collective: every rank must construct it, with the same parameters.
// Destroying it removes its hooks from the parameters, and with them its effect.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distributed/comm_hooks.h"
#include "distributed/reducer.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace ember::distributed {

// The fields of torch's DistributedDataParallel (and Accelerate's DistributedDataParallelKwargs).
struct DDPOptions {
  double bucket_cap_mb = 25.0;
  // The first bucket's cap, small so communication starts early in backward (torch's
  // first-bucket bytes cap, 1 MB). The layout is rebuilt once after the first synchronised
  // pass, in the order gradients became ready there (docs/ddp_communication.md).
  double first_bucket_cap_mb = 1.0;
  // Broadcast buffers (e.g. running statistics) from rank 0 in sync_buffers()/forward().
  bool broadcast_buffers = true;
  // Parameters without a gradient in a backward pass count as zeros instead of an error
  // (costs one extra small all-reduce per step).
  bool find_unused_parameters = false;
  // .grad becomes a view into the communication buffer: saves a copy and memory.
  bool gradient_as_bucket_view = false;
  // Every pass uses the same parameters: with find_unused_parameters, the usage all-reduce is
  // skipped after the first pass; a pass that uses other parameters is an error.
  bool static_graph = false;
  // Built-in communication hook (Accelerate's DDPCommunicationHookType): FP16 / BF16 send each
  // bucket compressed to half the bytes, POWER_SGD low-rank factors of each gradient matrix. A
  // custom hook: register_comm_hook.
  CommHookType comm_hook = CommHookType::NONE;
  PowerSGDOptions powersgd = {};  // with comm_hook = POWER_SGD
};

class DistributedDataParallel {
 public:
  // Checks that every rank holds the same parameter and buffer names/shapes/dtypes, copies
  // rank 0's parameters and buffers to every rank, builds the buckets and installs the hooks.
  DistributedDataParallel(std::shared_ptr<nn::Module> model, std::shared_ptr<ProcessGroup> pg,
                          DDPOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // The single-tensor forward: sync_buffers() (when broadcast_buffers), then the model's.
  Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  // Copies rank 0's buffers to every rank (a collective). No-op when broadcast_buffers is off
  // or the model has no buffers.
  void sync_buffers();

  // While the guard lives, backward only accumulates gradients locally; the first backward
  // after it all-reduces everything accumulated (gradient accumulation without extra traffic).
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(Reducer& reducer) : reducer_(&reducer), previous_(reducer.sync()) { reducer.set_sync(false); }
    ~NoSyncGuard() {
      if (reducer_) reducer_->set_sync(previous_);
    }
    NoSyncGuard(NoSyncGuard&& o) noexcept : reducer_(o.reducer_), previous_(o.previous_) { o.reducer_ = nullptr; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(NoSyncGuard&&) = delete;

   private:
    Reducer* reducer_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*reducer_); }
  bool require_backward_grad_sync() const { return reducer_->sync(); }
  void set_require_backward_grad_sync(bool on) { reducer_->set_sync(on); }

  const std::shared_ptr<nn::Module>& module() const { return model_; }
  const std::shared_ptr<ProcessGroup>& process_group() const { return pg_; }
  const DDPOptions& options() const { return options_; }

  // Bytes of each gradient bucket, in the order they are all-reduced; and their parameters.
  std::vector<int64_t> bucket_sizes() const { return reducer_->bucket_sizes(); }
  std::vector<std::vector<std::string>> bucket_parameter_names() const { return reducer_->bucket_parameter_names(); }
  // Communication time: total span and the part exposed at the end of backward, per step.
  const CommStats& comm_stats() const { return reducer_->stats(); }
  void reset_comm_stats() { reducer_->reset_stats(); }
  // Whether the layout follows the first pass's real gradient order yet, and that order.
  bool buckets_rebuilt() const { return reducer_->buckets_rebuilt(); }
  std::vector<std::string> gradient_ready_order() const { return reducer_->gradient_ready_order(); }
  // Steps `opt` on each bucket's parameters as soon as that bucket's average has landed, during
  // the end of backward, so the last buckets' communication overlaps the first ones' updates
  // (torch's optimizer in backward). Then the loop does not call opt.step() for them (zero_grad
  // as usual). Not with gradient clipping (it needs every gradient first), a GradScaler's
  // unscale, or find_unused_parameters. The wrapper keeps `opt` alive.
  void overlap_optimizer_step(std::shared_ptr<optim::Optimizer> opt);

  // Every bucket's reduction goes through `hook` (comm_hooks.h); before the first backward.
  void register_comm_hook(CommHook hook) { reducer_->register_comm_hook(std::move(hook)); }

  // Gradient order, bucket layout and communication figures, as EMBER_DISTRIBUTED_DEBUG prints.
  std::string debug_report() const { return reducer_->debug_report(); }

 private:
  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<ProcessGroup> pg_;
  DDPOptions options_;
  std::shared_ptr<Reducer> reducer_;
};

}  // namespace ember::distributed
