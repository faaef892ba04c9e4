// Sharded data parallel (ZeRO stages, FSDP-style): the training loop is DDP's, but what every
// rank holds shrinks with the world size N. See docs/sharded_data_parallel.md.
//
//   auto fsdp = distributed::shard_model(model, pg, {.sharding_strategy = ShardingStrategy::SHARD_GRAD_OP,
//                                                    .auto_wrap_policy = AutoWrapPolicy::NO_WRAP});
//   optim::AdamW opt(fsdp->parameters(), {.lr = 1e-4});   // this rank's shard views
//   for (...) {
//     loss(model->forward(x)).backward();   // forward first gathers what the last step updated;
//                                           // backward reduce-scatters gradients into the shards
//     fsdp->clip_grad_norm_(1.0);      // the global norm, across shards
//     opt.step(); opt.zero_grad();
//   }
//
// NO_SHARD, SHARD_OPTIMIZER (stage 1) and SHARD_GRAD_OP (stage 2) keep the parameters
// replicated as views into their unit's flat f32 buffer; the optimizer steps this rank's slice
// of it in place through the shard views, and sync_parameters() (run by a forward pre-hook on
// the model, and by the Accelerator after each step) all-gathers the other slices.
// FULL_SHARD (stage 3) keeps only the f32 shard: each unit's parameters are all-gathered just
// before its forward (the next unit's gather issued ahead, forward_prefetch), freed after it
// (reshard_after_forward; never for the root unit), gathered again when backward reaches the
// unit (the previous unit's gather issued ahead, backward_prefetch) and freed once its
// gradients are reduce-scattered. Outside forward and backward the parameters hold no memory:
// read them inside summon_full_params(), or take full_state_dict().
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/removable_handle.h"
#include "distributed/flat_param.h"
#include "distributed/fsdp_options.h"
#include "distributed/process_group.h"
#include "distributed/reducer.h"
#include "nn/module.h"

namespace ember::distributed {

// Where this rank's shard of one parameter lies: elements [first, first + numel) of the
// parameter flattened in row-major order. Sharded checkpoints are written and read in these
// terms, so they do not depend on the unit layout or the world size that wrote them.
struct ShardPiece {
  std::string name;  // the parameter's name in the model
  Shape shape;       // the whole parameter's shape
  int64_t first = 0;
  int64_t numel = 0;
  Tensor shard;      // the shard view (1-D f32, numel elements): what the optimizer steps
};

class FullyShardedDataParallel : public std::enable_shared_from_this<FullyShardedDataParallel> {
 public:
  // A collective: checks every rank built the same model, copies rank 0's parameters and
  // buffers everywhere, lays out the units and installs the gradient hooks.
  static std::shared_ptr<FullyShardedDataParallel> create(std::shared_ptr<nn::Module> model,
                                                          std::shared_ptr<ProcessGroup> pg, FSDPOptions options);
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // This rank's shard of every trainable parameter, in model order: a 1-D f32 view of the part
  // of the parameter inside this rank's slice of its unit (0 elements when none is). These are
  // what the optimizer steps; their .grad is the averaged gradient of that part.
  std::vector<Tensor> parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  // The shard views of `params` (original parameters of the model), in that order: turns a
  // user's parameter group into the group the optimizer needs.
  std::vector<Tensor> sharded(const std::vector<Tensor>& params) const;
  // The shard view of one parameter of the model; undefined when `param` is none of them.
  Tensor shard_of(const Tensor& param) const;

  // All-gathers every unit's slices when a synchronised backward happened since the last
  // gather, so the replicated parameters hold the values the optimizer stepped. Collective; the
  // model's forward pre-hook calls it, so only code that reads the parameters outside forward
  // (state_dict, evaluation by hand) needs to call it.
  void sync_parameters();

  // This rank's piece of every trainable parameter, in model order (pieces of 0 elements
  // included, so every rank lists every parameter).
  std::vector<ShardPiece> shard_pieces() const;
  // The whole model's state (parameters and buffers, model.state_dict() names), as copies that
  // outlive later steps. Collective: every rank must call it; every rank gets the full values.
  std::vector<std::pair<std::string, Tensor>> full_state_dict();
  // Call after writing into the shard views other than by an optimizer step (loading a
  // checkpoint): the next forward, or sync_parameters(), gathers them.
  void shards_changed() { parameters_stale_ = true; }

  // While the guard lives every parameter holds its full value (FULL_SHARD gathers them;
  // the other strategies sync_parameters()). With writeback, what the caller wrote into the
  // parameters is kept: every rank copies its slice back into its shard, so every rank must
  // write the same values. Collective on entry.
  class FullParamsGuard {
   public:
    FullParamsGuard(FullyShardedDataParallel& f, bool writeback);
    ~FullParamsGuard();
    FullParamsGuard(FullParamsGuard&& o) noexcept : f_(o.f_), writeback_(o.writeback_), released_(std::move(o.released_)) {
      o.f_ = nullptr;
    }
    FullParamsGuard(const FullParamsGuard&) = delete;
    FullParamsGuard& operator=(const FullParamsGuard&) = delete;
    FullParamsGuard& operator=(FullParamsGuard&&) = delete;

   private:
    FullyShardedDataParallel* f_;
    bool writeback_;
    std::vector<size_t> released_;  // units to free again on exit
  };
  [[nodiscard]] FullParamsGuard summon_full_params(bool writeback = true) { return FullParamsGuard(*this, writeback); }
  // FULL_SHARD: whether unit u's parameters hold memory now (always true for other strategies).
  bool unit_gathered(size_t u) const;

  // Scales the shard gradients so the norm of the whole (unsharded) gradient is at most
  // max_norm; returns that norm before clipping, the same on every rank. Collective.
  double clip_grad_norm_(double max_norm, double norm_type = 2.0, bool error_if_nonfinite = false);

  // While the guard lives backward accumulates full gradients locally (memory: +4 bytes per
  // parameter under SHARD_GRAD_OP); the next synchronised backward reduces them.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(FullyShardedDataParallel& f) : f_(&f), previous_(f.sync_) { f.sync_ = false; }
    ~NoSyncGuard() {
      if (f_) f_->sync_ = previous_;
    }
    NoSyncGuard(NoSyncGuard&& o) noexcept : f_(o.f_), previous_(o.previous_) { o.f_ = nullptr; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(NoSyncGuard&&) = delete;

   private:
    FullyShardedDataParallel* f_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }
  bool require_backward_grad_sync() const { return sync_; }
  void set_require_backward_grad_sync(bool on) { sync_ = on; }

  const std::shared_ptr<nn::Module>& module() const { return model_; }
  const std::shared_ptr<ProcessGroup>& process_group() const { return pg_; }
  const FSDPOptions& options() const { return options_; }
  // Units in layout order; their display names ("(root)" for the root unit).
  const std::vector<UnitLayout>& units() const { return layouts_; }
  std::vector<std::string> unit_names() const;
  // Bytes reduced (gradients) and gathered (parameters), and the time backward waited.
  const CommStats& comm_stats() const { return stats_; }
  int64_t bytes_gathered() const { return bytes_gathered_; }

  // Removes the gradient hooks (idempotent); the destructor calls it.
  void remove_hooks();

 private:
  struct Unit;
  struct PassToken;
  FullyShardedDataParallel(std::shared_ptr<nn::Module> model, std::shared_ptr<ProcessGroup> pg, FSDPOptions options);
  void build_units();
  void install_hooks();
  std::pair<int64_t, int64_t> owned_range(const UnitLayout& u) const;

  bool full_shard() const { return options_.sharding_strategy == ShardingStrategy::FULL_SHARD; }
  // The dtype of the gathered parameters: FULL_SHARD's param_dtype, else f32.
  DType compute_dtype() const;
  // Makes unit u's parameters views of `flat` (its layout's offsets), keeping their identity.
  void bind_parameters(size_t u, const Tensor& flat);
  bool reshards_after_forward(size_t unit) const;
  // FULL_SHARD gathering: gather issues the unit's all-gather (no-op when it holds memory or one
  // is in flight), ensure_gathered also waits for it, reshard frees the memory again.
  void gather(size_t unit);
  void ensure_gathered(size_t unit);
  void reshard(size_t unit);
  // The unit after (step = +1) or before (-1) `unit` in the order the last forward ran them.
  std::optional<size_t> neighbour(size_t unit, int step) const;
  void pre_forward(size_t unit);
  Tensor post_forward(size_t unit, const Tensor& out);
  Tensor attach_pre_backward(size_t unit, const Tensor& out);
  void pre_backward(size_t unit);

  void on_gradient_ready(size_t unit, size_t param);
  void begin_pass();
  void launch_ready_units();
  void launch(size_t unit);
  void complete(size_t unit);  // waits for its reduction and adds it to the shard gradients
  void finish_pass();
  void abandon_pass() noexcept;
  void reset_pass_state();

  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<ProcessGroup> pg_;
  FSDPOptions options_;
  std::vector<UnitLayout> layouts_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<size_t> launch_order_;  // units in reduction order (last layers first)
  std::vector<RemovableHandle> hooks_;
  std::vector<size_t> forward_order_;  // units in the order the last complete forward ran them
  std::vector<size_t> recording_;      // ... and the forward running now
  std::vector<size_t> launched_;       // reductions in flight, oldest first

  bool sync_ = true;
  bool pass_active_ = false;
  bool parameters_stale_ = false;  // a reduction happened since the last gather
  size_t next_launch_ = 0;
  CommStats stats_;
  int64_t bytes_gathered_ = 0;
};

// Wraps `model` for sharded data parallel over `pg`; keep the returned object alive while
// training. Construction is a collective.
std::shared_ptr<FullyShardedDataParallel> shard_model(std::shared_ptr<nn::Module> model,
                                                      std::shared_ptr<ProcessGroup> pg, FSDPOptions options = {});

}  // namespace ember::distributed
