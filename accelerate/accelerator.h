// Accelerator: the C++ twin of Hugging Face Accelerate's Accelerator. Write the single-device
// loop, add a few lines, and the same program runs on one process (no launcher, no
// environment) or on many started by `ember launch`:
//
//   Accelerator acc({.gradient_accumulation_steps = 4});
//   auto [m, o, l, s] = acc.prepare(model, opt, loader, sched);
//   for (int64_t epoch = l->epoch(); epoch < epochs; ++epoch) {
//     l->set_epoch(epoch);
//     for (auto& batch : *l) {
//       auto guard = acc.accumulate(m);
//       auto out = m->forward(batch);
//       acc.backward(out.loss);
//       if (acc.sync_gradients()) acc.clip_grad_norm_(m->parameters(), 1.0);
//       o->step();
//       s->step();
//       o->zero_grad();
//     }
//   }
//
// The semantics users trip over (scheduler stepping, loss scaling under accumulation,
// gather_for_metrics, even_batches, split_batches) are tabled in docs/accelerate_semantics.md.
//
// Options the program leaves at their defaults are filled from the environment `ember launch`
// sets, as Accelerate does: mixed_precision "no" <- EMBER_MIXED_PRECISION,
// gradient_accumulation_steps 1 <- EMBER_GRADIENT_ACCUMULATION_STEPS, cpu false <- EMBER_USE_CPU.
//
// Mixed precision ("bf16" or "fp16"): parameters, gradients and optimizer state stay f32; a
// prepared model's calls (`m->forward(batch)`) run under autocast, as do blocks inside
// `auto ac = acc.autocast();`: matmul/linear/bmm compute in the half type and softmax,
// layer_norm, losses and reductions in f32 (core/autocast.h). "fp16"
// adds a loss scaler (optim::GradScaler, options in AcceleratorOptions::scaler): backward()
// scales the loss, clipping unscales the gradients first, and the prepared optimizer skips an
// update whose gradients overflowed (optimizer_step_was_skipped(); the prepared scheduler then
// does not advance). bf16 has f32's range and needs no scaling.
#pragma once
// A guard written as a bare statement (`acc.accumulate(m);`, `acc.autocast();`) would end at
// its semicolon and change nothing. Discarding a [[nodiscard]] result is therefore an error,
// not a warning, from here to the end of every file that includes this header (the compiler's
// -Wunused-result, so any discarded [[nodiscard]] or warn_unused_result value counts); define
// EMBER_ALLOW_DISCARDED_RESULTS before including it to keep the warning instead.
#if defined(__GNUC__) && !defined(EMBER_ALLOW_DISCARDED_RESULTS)
#pragma GCC diagnostic error "-Wunused-result"
#endif
#include <chrono>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "accelerate/accelerated_dataloader.h"
#include "accelerate/accelerated_model.h"
#include "accelerate/accelerated_optimizer.h"
#include "accelerate/accelerated_scheduler.h"
#include "accelerate/accelerator_state.h"
#include "accelerate/checkpointing.h"
#include "accelerate/heartbeat.h"
#include "core/autocast.h"
#include "core/error.h"
#include "core/removable_handle.h"
#include "data/dataloader.h"
#include "distributed/ddp.h"
#include "distributed/fsdp.h"
#include "distributed/operations.h"
#include "nn/module.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "tracking/tracker_group.h"

namespace ember::distributed {

// Options are designated initialisers, and C++ wants them in declaration order:
// `{.split_batches = true, .mixed_precision = "bf16"}` does not compile, while
// `{.mixed_precision = "bf16", .split_batches = true}` does. The order:
//   mixed_precision, gradient_accumulation_steps, cpu, split_batches, even_batches,
//   step_scheduler_with_optimizer, log_with, project_dir, total_limit, seed,
//   sync_with_dataloader, timeout, ddp, scaler, check_finite_loss, autocast_prepared_model,
//   fsdp, sync_each_batch, overlap_optimizer_step, checkpoint_every_n_steps,
//   checkpoint_every_seconds
// New options are added at the end, so initialisers written for an older list still compile.
struct AcceleratorOptions {
  std::string mixed_precision = "no";  // "no" | "fp16" | "bf16"
  int gradient_accumulation_steps = 1;
  bool cpu = false;  // stay on the CPU even when CUDA is present
  // Loaders: batch_size is the global batch (cut into num_processes slices) instead of the
  // per-process batch.
  bool split_batches = false;
  // Loaders: pad the last round by wrapping around so every process gets the same number of
  // full batches (gather_for_metrics drops the duplicates again).
  bool even_batches = true;
  // Prepared schedulers step with the optimizer (num_processes times per real update unless
  // split_batches); off: every call steps once.
  bool step_scheduler_with_optimizer = true;
  // Experiment trackers init_trackers/log write to, under <project_dir>/<project_name>/ (so
  // project_dir is then required): "jsonl" (metrics.jsonl), "tensorboard" (an event file),
  // "all". Declared before project_dir so that {.log_with = ..., .project_dir = ...} compiles.
  std::vector<std::string> log_with = {};
  // save_state() without a directory writes <project_dir>/checkpoints/checkpoint_<n>.
  std::string project_dir = "";
  // Automatic checkpoints kept under project_dir (the oldest are removed); -1: all.
  int total_limit = -1;
  // set_seed(*seed) at construction.
  std::optional<uint64_t> seed = std::nullopt;
  // The end of a loader's epoch forces a synchronising step under accumulate().
  bool sync_with_dataloader = true;
  // Bound on the rendezvous and on every collective; a dead peer becomes an ember::Error.
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  // How prepare() wraps models in DistributedDataParallel when there are several processes.
  DDPOptions ddp = {};
  // The loss scaler of mixed_precision "fp16" (Accelerate's GradScalerKwargs); unused otherwise.
  optim::GradScalerOptions scaler = {};
  // backward() / backward_token_sum() check that this process's loss is finite: "no" (default;
  // the check reads the loss on the host, one sync per call), "warn" (a line on stderr,
  // "non-finite loss (nan) at step N", and training goes on) or "error" (throws ember::Error
  // with that message before any gradient is computed). N counts backward calls from 1. Only
  // the rank whose loss is bad stops; the others then see a dead peer in their next collective.
  std::string check_finite_loss = "no";
  // Under mixed precision, a prepared model's calls through its handle (`m->forward(...)`) run
  // under autocast, as Accelerate wraps a prepared model's forward (accelerate/accelerated_model.h).
  // false: only code inside acc.autocast() autocasts (Accelerate's AutocastKwargs(enabled=False)).
  bool autocast_prepared_model = true;
  // Sharded data parallel instead of DDP when there are several processes (Accelerate's
  // fsdp_plugin): prepare() shards each model (distributed/fsdp.h), rewrites the parameter
  // groups of each optimizer prepared after it to the shard views, gathers the parameters after
  // every optimizer step, and routes clip_grad_norm_ and accumulate() to the sharded wrapper.
  // Prepare a model before its optimizers. With one process only mixed precision applies.
  std::optional<FSDPOptions> fsdp = std::nullopt;
  // Under gradient accumulation, reduce the gradients of every micro-batch instead of keeping
  // them local until the window's last (Accelerate's GradientAccumulationPlugin(sync_each_batch)).
  // Slower, but no full-size gradients are kept between micro-batches: under SHARD_GRAD_OP and
  // FULL_SHARD each rank holds only its gradient shard (4 bytes per parameter less than no_sync).
  bool sync_each_batch = false;
  // With several processes under DDP: each bucket's parameters are stepped as soon as its
  // average lands during backward (DistributedDataParallel::overlap_optimizer_step, torch's
  // optimizer in backward), so the last buckets' communication overlaps the other updates;
  // opt->step() then only counts the update. Prepare the model before its optimizer. Refused
  // with fp16 loss scaling and by clip_grad_norm_ (the step ran before either could act); the
  // weights equal the ordinary step's. One process: the ordinary step.
  bool overlap_optimizer_step = false;
  // Automatic checkpoints (Accelerate's ProjectConfiguration, with a policy): maybe_save_state()
  // saves <project_dir>/checkpoints/checkpoint_<n> once this many optimizer steps have passed
  // since the last save or load (0: no step policy) ...
  int64_t checkpoint_every_n_steps = 0;
  // ... or once this many seconds have passed (process 0's clock decides for every process;
  // 0: no time policy). Either needs project_dir.
  double checkpoint_every_seconds = 0;
};

using tracking::LogValues;
using tracking::Tracker;
using tracking::TrackerConfig;
using tracking::TrackerValue;

// Removes a registered hook when remove() is called (destroying the handle keeps the hook).
using ember::RemovableHandle;

namespace detail {

template <typename T> struct is_shared_ptr : std::false_type {};
template <typename T> struct is_shared_ptr<std::shared_ptr<T>> : std::true_type { using element = T; };
template <typename T> struct is_shared_ptr<PreparedModel<T>> : std::true_type { using element = T; };
template <typename T> struct is_unique_ptr : std::false_type {};
template <typename T, typename D> struct is_unique_ptr<std::unique_ptr<T, D>> : std::true_type { using element = T; };

// The object a handle points to (or the object itself).
template <typename A> struct pointee { using type = A; };
template <typename T> struct pointee<std::shared_ptr<T>> { using type = T; };
template <typename T> struct pointee<PreparedModel<T>> { using type = T; };
template <typename T, typename D> struct pointee<std::unique_ptr<T, D>> { using type = T; };
template <typename T> using pointee_t = typename pointee<std::remove_cvref_t<T>>::type;

template <typename T>
constexpr bool is_scheduler_arg = std::is_base_of_v<optim::LRScheduler, pointee_t<T>>;

template <typename T>
std::shared_ptr<T> borrow(T& obj) {
  return std::shared_ptr<T>(&obj, [](T*) {});
}

}  // namespace detail

class Accelerator {
 public:
  explicit Accelerator(AcceleratorOptions options = {});
  ~Accelerator();
  Accelerator(const Accelerator&) = delete;
  Accelerator& operator=(const Accelerator&) = delete;

  // ---- who and where
  Device device() const { return state_->device(); }
  int process_index() const { return state_->process_index(); }
  int local_process_index() const { return state_->local_process_index(); }
  int num_processes() const { return state_->num_processes(); }
  bool is_main_process() const { return state_->is_main_process(); }
  bool is_local_main_process() const { return state_->is_local_main_process(); }
  std::string distributed_type() const { return state_->distributed_type(); }
  const std::string& mixed_precision() const { return options_.mixed_precision; }
  int gradient_accumulation_steps() const { return options_.gradient_accumulation_steps; }
  const AcceleratorOptions& options() const { return options_; }
  AcceleratorState& state() { return *state_; }
  GradientState& gradient_state() { return *gradient_state_; }
  ProcessGroup* process_group() const { return state_->process_group().get(); }

  // ---- the accumulation window
  // True on the micro-step that ends an accumulation window (optimizer and scheduler step).
  bool sync_gradients() const { return gradient_state_->sync_gradients(); }
  // True when a prepared optimizer skipped its last update (mixed-precision overflow).
  bool optimizer_step_was_skipped() const;
  // Micro-steps counted by accumulate() in the current window (Accelerate's `step`).
  int64_t step() const { return step_; }

  // ---- prepare: models, optimizers, data loaders and schedulers in any number and order;
  // returned in the same order (one object alone is returned as itself, not as a tuple).
  //   shared_ptr<M> (M an nn::Module)        -> PreparedModel<M>: the same shared_ptr (moved
  //                                             to device(); with several processes DDP is
  //                                             installed on it) whose `->` calls run under
  //                                             autocast with mixed precision
  //   O& or shared_ptr<O> (an Optimizer)     -> shared_ptr<AcceleratedOptimizer>
  //   DataLoader& or shared_ptr<DataLoader>  -> shared_ptr<AcceleratedDataLoader>
  //   S&, shared_ptr<S>, unique_ptr<S>& or unique_ptr<S>&& (an LRScheduler)
  //                                          -> shared_ptr<AcceleratedScheduler>
  // Objects passed by reference (or unique_ptr lvalue) must outlive their prepared handles.
  // Schedulers are prepared last, bound to every optimizer prepared so far.
  template <typename... Ts>
  auto prepare(Ts&&... objs) {
    static_assert(sizeof...(Ts) >= 1, "Accelerator::prepare: pass at least one object");
    std::tuple<std::optional<decltype(prepare_one(std::forward<Ts>(objs)))>...> slots;
    prepare_pass<false>(slots, std::index_sequence_for<Ts...>{}, std::forward<Ts>(objs)...);
    prepare_pass<true>(slots, std::index_sequence_for<Ts...>{}, std::forward<Ts>(objs)...);
    if constexpr (sizeof...(Ts) == 1) {
      return std::move(*std::get<0>(slots));
    } else {
      return std::apply([](auto&... s) { return std::make_tuple(std::move(*s)...); }, slots);
    }
  }

  template <typename M>
    requires std::is_base_of_v<nn::Module, M>
  PreparedModel<M> prepare_one(const std::shared_ptr<M>& model) {
    prepare_model(model);
    return PreparedModel<M>(model, forward_autocast());
  }
  template <typename O>
    requires std::is_base_of_v<optim::Optimizer, O>
  std::shared_ptr<AcceleratedOptimizer> prepare_one(const std::shared_ptr<O>& opt) {
    return prepare_optimizer(opt);
  }
  template <typename O>
    requires std::is_base_of_v<optim::Optimizer, O>
  std::shared_ptr<AcceleratedOptimizer> prepare_one(O& opt) {
    return prepare_optimizer(detail::borrow<optim::Optimizer>(opt));
  }
  std::shared_ptr<AcceleratedDataLoader> prepare_one(const data::DataLoader& loader) {
    return prepare_data_loader(loader);
  }
  std::shared_ptr<AcceleratedDataLoader> prepare_one(const std::shared_ptr<data::DataLoader>& loader);
  template <typename S>
    requires std::is_base_of_v<optim::LRScheduler, S>
  std::shared_ptr<AcceleratedScheduler> prepare_one(S& sched) {
    return prepare_scheduler(detail::borrow<optim::LRScheduler>(sched));
  }
  template <typename S>
    requires std::is_base_of_v<optim::LRScheduler, S>
  std::shared_ptr<AcceleratedScheduler> prepare_one(const std::shared_ptr<S>& sched) {
    return prepare_scheduler(sched);
  }
  template <typename S, typename D>
    requires std::is_base_of_v<optim::LRScheduler, S>
  std::shared_ptr<AcceleratedScheduler> prepare_one(std::unique_ptr<S, D>& sched) {
    return prepare_scheduler(detail::borrow<optim::LRScheduler>(*sched));
  }
  template <typename S, typename D>
    requires std::is_base_of_v<optim::LRScheduler, S>
  std::shared_ptr<AcceleratedScheduler> prepare_one(std::unique_ptr<S, D>&& sched) {
    return prepare_scheduler(std::shared_ptr<optim::LRScheduler>(std::move(sched)));
  }

  void prepare_model(const std::shared_ptr<nn::Module>& model);
  void sync_buffers_before_forward(nn::Module& model, const std::shared_ptr<DistributedDataParallel>& ddp);
  // Under fsdp: replaces each sharded model's parameters in the optimizer's groups by their shards.
  void shard_parameter_groups(optim::Optimizer& opt) const;
  std::shared_ptr<AcceleratedOptimizer> prepare_optimizer(std::shared_ptr<optim::Optimizer> opt);
  // overlap_optimizer_step: hands `opt` to the DDP model that owns its parameters; true when it
  // is stepped during backward from now on.
  bool overlap_with_ddp(const std::shared_ptr<optim::Optimizer>& opt);
  void check_not_stepped_in_backward(const char* op) const;
  std::shared_ptr<AcceleratedDataLoader> prepare_data_loader(const data::DataLoader& loader);
  std::shared_ptr<AcceleratedScheduler> prepare_scheduler(std::shared_ptr<optim::LRScheduler> sched);

  // The same model (Ember's DDP does not wrap the model's type). keep_fp32_wrapper, as in
  // Accelerate: the handle of a prepared model keeps running its calls under autocast; false
  // gives one that calls the model as it is.
  template <typename M>
  PreparedModel<M> unwrap_model(const std::shared_ptr<M>& model, bool keep_fp32_wrapper = true) const {
    const bool prepared = model && is_prepared(*model);
    return PreparedModel<M>(model, keep_fp32_wrapper && prepared ? forward_autocast() : ForwardAutocast{});
  }
  // True when prepare() was given this model.
  bool is_prepared(const nn::Module& model) const;
  // The DDP object prepare() installed on `model` (nullptr with one process or unprepared).
  std::shared_ptr<DistributedDataParallel> ddp(const nn::Module& model) const;
  // The sharded wrapper prepare() installed on `model` under options.fsdp (nullptr otherwise).
  std::shared_ptr<FullyShardedDataParallel> fsdp(const nn::Module& model) const;

  // ---- training step
  // backward of loss / gradient_accumulation_steps (always divided, as in Accelerate), times
  // the loss scale under fp16.
  void backward(const Tensor& loss);
  // backward of loss_sum / global_tokens, times num_processes (undoing DDP's average) and not
  // divided by the accumulation steps: with global_tokens counted over the whole accumulation
  // window on every process (global_token_count), the summed gradients equal those of the
  // token-mean loss over the one big batch the window stands for. Scaled like backward() under
  // fp16.
  void backward_token_sum(const Tensor& loss_sum, int64_t global_tokens);
  // Tokens over all processes: the sum of every process's `local_count` (a collective).
  int64_t global_token_count(int64_t local_count);
  // Non-finite losses seen by backward() / backward_token_sum() under check_finite_loss.
  int64_t nonfinite_losses() const { return nonfinite_losses_; }
  // Non-zero entries of the masks (e.g. labels != -100), summed over the masks and processes.
  int64_t global_token_count(const std::vector<Tensor>& masks);

  class SyncGuard {
   public:
    SyncGuard() = default;
    SyncGuard(SyncGuard&&) noexcept = default;
    SyncGuard(const SyncGuard&) = delete;
    SyncGuard& operator=(const SyncGuard&) = delete;
    SyncGuard& operator=(SyncGuard&&) = delete;

   private:
    friend class Accelerator;
    std::vector<DistributedDataParallel::NoSyncGuard> guards_;
    std::vector<FullyShardedDataParallel::NoSyncGuard> sharded_guards_;
  };
  // Counts a micro-step: sync_gradients() becomes true on every K-th one and on the last batch
  // of the loader's epoch; otherwise the models' gradients accumulate locally (DDP no_sync)
  // while the guard lives. No models: every prepared model.
  // Like every guard here, it must be kept in a variable for the scope it covers (a bare
  // statement does not compile, see the top of this file).
  template <typename... M>
  [[nodiscard("keep the guard for the loop body: auto guard = acc.accumulate(m);")]]
  SyncGuard accumulate(const std::shared_ptr<M>&... models) {
    return accumulate_models({static_cast<const nn::Module*>(models.get())...});
  }
  [[nodiscard("keep the guard for the loop body: auto guard = acc.accumulate_models(models);")]]
  SyncGuard accumulate_models(std::vector<const nn::Module*> models);
  // Gradients of `model` stay local while the guard lives (nothing when not distributed).
  [[nodiscard("keep the guard for the scope: auto local = acc.no_sync(m);")]]
  SyncGuard no_sync(const nn::Module& model);
  template <typename M>
  [[nodiscard("keep the guard for the scope: auto local = acc.no_sync(m);")]]
  SyncGuard no_sync(const std::shared_ptr<M>& model) {
    return no_sync(static_cast<const nn::Module&>(*model));
  }

  // The mixed-precision scope for code outside the prepared models (their own calls autocast
  // already, see autocast_prepared_model): autocast on device() in bf16 or f16 while the guard
  // lives; with mixed_precision "no" a guard that changes nothing (an enclosing autocast scope
  // stays in force, as with Accelerate's nullcontext).
  [[nodiscard("keep the scope for the code it covers: auto autocast = acc.autocast();")]]
  AutocastGuard autocast() const;
  // The loss scaler of mixed_precision "fp16" (nullptr otherwise).
  optim::GradScaler* scaler() const { return scaler_.get(); }

  // Gradient clipping; returns the total norm (of the true, unscaled gradients under fp16).
  // Clips only on synchronising micro-steps (partial sums in between are not the gradients the
  // optimizer will use): there the norm of the accumulated gradients is returned and nothing
  // changes. On a synchronising step under fp16 the gradients are unscaled first.
  double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);
  void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);
  // fp16: divides the gradients of every prepared optimizer by the loss scale, in place (once
  // per step; the optimizer's step then does not unscale again). Nothing otherwise.
  void unscale_gradients();

  // ---- collectives (every process calls them, in the same order)
  // Each takes a tensor or a nested structure of them (std::tuple, std::pair, std::vector,
  // Batch, std::map<std::string, ...>; distributed/tensor_tree.h) and returns the same
  // structure, every tensor treated as the one-tensor form treats it, in one exchange per
  // dtype (distributed/operations.h):
  //   auto [predictions, labels] = acc.gather_for_metrics(std::make_tuple(predictions, batch["labels"]));
  Tensor gather(const Tensor& tensor) const;
  // gather(), then on the last batch of the loader's epoch drops the wrap-around duplicates, so
  // over an epoch every sample is seen exactly once, in the loader's order.
  Tensor gather_for_metrics(const Tensor& tensor) const;
  Tensor reduce(const Tensor& tensor, const std::string& reduction = "sum", double scale = 1.0) const;
  // Pads along `dim` only, to the largest size any process has there (other dims may differ).
  Tensor pad_across_processes(const Tensor& tensor, int64_t dim = 0, double pad_index = 0,
                              bool pad_first = false) const;
  Tensor broadcast(const Tensor& tensor, int from = 0) const;

  template <NestedTensors S>
  tensor_tree_t<S> gather(const S& tensors) const {
    return distributed::gather(tensors, process_group());
  }
  template <NestedTensors S>
  tensor_tree_t<S> gather_for_metrics(const S& tensors) const {
    std::vector<Tensor> all = detail::gather_leaves(flatten_tensors(tensors), process_group());
    for (auto& t : all) t = drop_padding(t);
    return rebuild_tensors(tensors, all);
  }
  template <NestedTensors S>
  tensor_tree_t<S> reduce(const S& tensors, const std::string& reduction = "sum", double scale = 1.0) const {
    return distributed::reduce(tensors, reduction, process_group(), scale);
  }
  template <NestedTensors S>
  tensor_tree_t<S> pad_across_processes(const S& tensors, int64_t dim = 0, double pad_index = 0,
                                        bool pad_first = false) const {
    return distributed::pad_across_processes(tensors, process_group(), dim, pad_index, pad_first);
  }
  template <NestedTensors S>
  tensor_tree_t<S> broadcast(const S& tensors, int from = 0) const {
    return distributed::broadcast(tensors, process_group(), from);
  }
  std::vector<std::string> gather_object(const std::string& mine) const;
  std::string broadcast_object(const std::string& value, int from = 0) const;
  void wait_for_everyone() const { state_->wait_for_everyone(); }

  // This process's contiguous share of `items` (the first len % num_processes processes get
  // one more); apply_padding repeats the last item so every share has the same length.
  template <typename T>
  std::vector<T> split_between_processes(const std::vector<T>& items, bool apply_padding = false) const {
    auto [begin, end] = split_between_processes(int64_t(items.size()));
    std::vector<T> out(items.begin() + begin, items.begin() + end);
    if (apply_padding && !items.empty()) {
      const int64_t longest = (int64_t(items.size()) + num_processes() - 1) / num_processes();
      while (int64_t(out.size()) < longest) out.push_back(items.back());
    }
    return out;
  }
  // The same split of `count` indices: this process's [begin, end).
  std::pair<int64_t, int64_t> split_between_processes(int64_t count) const;

  // ---- printing and ordering
  // Prints its arguments separated by spaces, as Python's print does, on the main process only:
  // acc.print("Process", i, "of", n) prints "Process 0 of 2".
  template <typename... A>
  void print(const A&... args) const {
    if (!is_main_process()) return;
    std::ostringstream os;
    [[maybe_unused]] const char* separator = "";  // unused when printing an empty line
    ((os << separator << args, separator = " "), ...);
    std::cout << os.str() << std::endl;
  }
  // The main process (or each machine's local main process) runs the guarded block first, the
  // others after it finished (e.g. downloading or preprocessing once).
  class ProcessOrderGuard {
   public:
    ProcessOrderGuard(const AcceleratorState* state, bool goes_first);
    ~ProcessOrderGuard() noexcept(false);
    ProcessOrderGuard(ProcessOrderGuard&& o) noexcept : state_(o.state_), goes_first_(o.goes_first_) {
      o.state_ = nullptr;
    }
    ProcessOrderGuard(const ProcessOrderGuard&) = delete;
    ProcessOrderGuard& operator=(const ProcessOrderGuard&) = delete;
    ProcessOrderGuard& operator=(ProcessOrderGuard&&) = delete;

   private:
    const AcceleratorState* state_;
    bool goes_first_;
  };
  [[nodiscard("keep the guard for the block: auto first = acc.main_process_first();")]]
  ProcessOrderGuard main_process_first() const { return {state_.get(), is_main_process()}; }
  [[nodiscard("keep the guard for the block: auto first = acc.local_main_process_first();")]]
  ProcessOrderGuard local_main_process_first() const { return {state_.get(), is_local_main_process()}; }

  // Seeds Ember's generator with `seed` (plus process_index() when device_specific).
  void set_seed(uint64_t seed, bool device_specific = false);

  // ---- saving
  // Weights for inference: an nn::PretrainedModel (the BERT models) through its
  // save_pretrained, as config.json + model.safetensors (Hugging Face format), any other model
  // as model.safetensors of its state_dict. Main process writes;
  // every process returns once it is written. Takes the handle prepare() returned, any
  // shared_ptr to the model, or the model itself.
  void save_model(const nn::Module& model, const std::string& dir);
  template <typename M>
    requires std::is_base_of_v<nn::Module, M>
  void save_model(const std::shared_ptr<M>& model, const std::string& dir) {
    EMBER_CHECK(model != nullptr, "save_model: the model is null");
    save_model(static_cast<const nn::Module&>(*model), dir);
  }
  // A state dict / object state written by the main process as safetensors at `path`. Every
  // process calls it (a failure on the main process raises on every process).
  void save(const nn::StateDict& state_dict, const std::string& path);
  void save(const ObjectState& state, const std::string& path);
  // save() as a function, for transformers-style save_pretrained:
  //   acc.unwrap_model(m)->save_pretrained(dir, {.is_main_process = acc.is_main_process(),
  //                                              .save_function = acc.save_function()});
  std::function<void(const nn::StateDict&, const std::string&)> save_function() {
    return [this](const nn::StateDict& state_dict, const std::string& path) { save(state_dict, path); };
  }

  // Everything needed to continue training: prepared models, optimizers, schedulers, every
  // process's generator state, each prepared loader's epoch and position, the loss scaler
  // (fp16) and the registered objects. Empty `dir`: <project_dir>/checkpoints/checkpoint_<n> (n counts up from 0, or from
  // the loaded checkpoint), keeping at most total_limit of them. Returns the directory.
  std::string save_state(const std::string& dir = "");
  // Restores a save_state directory (empty: the latest automatic checkpoint under project_dir,
  // or nothing at all on a fresh start, when there is none yet) in two phases:
  // every file is read and checked against what was prepared on every process, then, only if
  // all processes accepted it, everything is applied. Raises ember::Error naming the file and
  // the field when it does not fit, with nothing changed on any process. Returns the
  // directory loaded ("" when there was nothing to load).
  std::string load_state(const std::string& dir = "");
  // Saves an automatic checkpoint when the policy (checkpoint_every_n_steps,
  // checkpoint_every_seconds) says one is due, and returns its directory; nullopt otherwise.
  // Call it on every process once per micro-batch, after the optimizer and scheduler steps and
  // zero_grad: it counts the micro-batches that ended an accumulation window (optimizer steps)
  // and never saves inside a window. With load_state() at the top of the program, one program
  // serves the first start and every restart:
  //   acc.load_state();                 // the latest checkpoint, or nothing on a fresh start
  //   for (auto& batch : *loader) { ...; opt->step(); sched->step(); opt->zero_grad();
  //                                 acc.maybe_save_state(); }
  std::optional<std::string> maybe_save_state();
  // Backward passes of the run so far (restored by load_state, so it counts across restarts);
  // what `ember launch`'s monitor sees as a rank's step.
  int64_t backward_passes() const { return backward_calls_; }
  // The number the next automatic checkpoint gets.
  int64_t save_iteration() const { return save_iteration_; }
  void set_save_iteration(int64_t n);

  // Objects saved and restored with the state: anything with state_dict() / load_state_dict()
  // (see Checkpointable), by reference (kept alive by the caller) or shared_ptr.
  template <typename... T>
  void register_for_checkpointing(T&&... objs) {
    (register_one(std::forward<T>(objs)), ...);
  }

  using SaveStatePreHook = std::function<void(std::vector<std::shared_ptr<nn::Module>>& models,
                                              std::vector<nn::StateDict>& weights, const std::string& dir)>;
  using LoadStatePreHook =
      std::function<void(std::vector<std::shared_ptr<nn::Module>>& models, const std::string& dir)>;
  // Run before save_state writes: may edit `weights` (one per model, in prepare order) or
  // remove entries to save fewer models. Run before load_state reads: may remove models it
  // restores itself.
  RemovableHandle register_save_state_pre_hook(SaveStatePreHook hook);
  RemovableHandle register_load_state_pre_hook(LoadStatePreHook hook);

  // The next pass of the loader's current epoch starts after its first `n` batches.
  void skip_first_batches(AcceleratedDataLoader& loader, int64_t n) { loader.skip_first_batches(n); }

  // ---- experiment tracking (Accelerate's init_trackers / log / end_training). The main
  // process writes; elsewhere these check their arguments and write nothing.
  // Starts the run <project_dir>/<project_name>/: config.json holds `config`, and every tracker
  // of log_with opens its file there (metrics.jsonl is appended to, so a resumed run continues
  // it). With log_with empty nothing is written and log() only checks its arguments.
  void init_trackers(const std::string& project_name, const TrackerConfig& config = {});
  // One row of scalars at `step`; without one, at the number of earlier log() calls since
  // init_trackers. Each tracker's file is flushed before this returns. Raises before
  // init_trackers and for the reserved names "step" and "wall_time".
  void log(const LogValues& values, std::optional<int64_t> step = std::nullopt);
  // Flushes and closes the trackers; again (or without a run) it does nothing. The destructor
  // calls it too. With "jsonl" and at least one row logged, the main process also writes the
  // run's curves to <project_dir>/<project_name>/report.html (what `ember plot` draws).
  void end_training();
  // The active tracker called `name` ("jsonl", "tensorboard"); nullptr when it is not selected,
  // no run is active, or this is not the main process.
  Tracker* get_tracker(const std::string& name) const { return trackers_->get(name); }

  const std::vector<std::shared_ptr<nn::Module>>& models() const { return models_; }
  const std::vector<std::shared_ptr<AcceleratedOptimizer>>& optimizers() const { return optimizers_; }
  const std::vector<std::shared_ptr<AcceleratedScheduler>>& schedulers() const { return schedulers_; }
  const std::vector<std::shared_ptr<AcceleratedDataLoader>>& dataloaders() const { return dataloaders_; }

 private:
  template <bool Schedulers, typename Slots, typename... Ts, size_t... I>
  void prepare_pass(Slots& slots, std::index_sequence<I...>, Ts&&... objs) {
    (prepare_slot<Schedulers>(std::get<I>(slots), std::forward<Ts>(objs)), ...);
  }
  template <bool Schedulers, typename Slot, typename T>
  void prepare_slot(Slot& slot, T&& obj) {
    if constexpr (detail::is_scheduler_arg<T> == Schedulers) slot.emplace(prepare_one(std::forward<T>(obj)));
  }

  template <typename T>
  void register_one(T&& obj) {
    using A = std::remove_cvref_t<T>;
    if constexpr (detail::is_shared_ptr<A>::value) {
      using E = typename detail::is_shared_ptr<A>::element;
      if constexpr (std::is_base_of_v<Checkpointable, E>) {
        custom_.push_back(obj);
      } else {
        custom_.push_back(std::make_shared<detail::CheckpointableAdapter<E>>(obj));
      }
    } else if constexpr (std::is_base_of_v<Checkpointable, A>) {
      custom_.push_back(detail::borrow<Checkpointable>(obj));
    } else {
      custom_.push_back(std::make_shared<detail::CheckpointableAdapter<A>>(detail::borrow<A>(obj)));
    }
  }

  void apply_env_defaults();
  void validate_options() const;
  // The autocast a prepared model's calls run under.
  ForwardAutocast forward_autocast() const;
  // gather_for_metrics's trimming of one gathered tensor.
  Tensor drop_padding(const Tensor& gathered) const;
  // Makes every process shuffle `loader` from process 0's seed when the seed was drawn from
  // the generator (one collective).
  void agree_on_drawn_seed(AcceleratedDataLoader& loader) const;
  // Runs fn on the main process; every process raises if it failed.
  void on_main_process(const std::string& what, const std::function<void()>& fn) const;
  // Empty when `dir` is empty and project_dir holds no checkpoint yet (a fresh start).
  std::string resolve_load_dir(const std::string& dir) const;
  // The checkpoint policy's clock and count start again (after a save or a load).
  void restart_checkpoint_policy();

  AcceleratorOptions options_;
  std::shared_ptr<AcceleratorState> state_;
  std::shared_ptr<GradientState> gradient_state_;
  std::shared_ptr<optim::GradScaler> scaler_;  // fp16 only
  int64_t step_ = 0;
  int64_t save_iteration_ = 0;
  int64_t backward_calls_ = 0;     // counted for check_finite_loss's messages
  int64_t nonfinite_losses_ = 0;
  int64_t steps_since_checkpoint_ = 0;  // optimizer steps maybe_save_state has counted
  std::chrono::steady_clock::time_point last_checkpoint_time_ = std::chrono::steady_clock::now();
  std::unique_ptr<Heartbeat> heartbeat_;
  void check_loss(const Tensor& loss, const char* op);

  std::vector<std::shared_ptr<nn::Module>> models_;
  std::vector<std::shared_ptr<DistributedDataParallel>> ddps_;  // parallel to models_ (null: none)
  std::vector<std::shared_ptr<FullyShardedDataParallel>> fsdps_;  // likewise, under options.fsdp
  std::vector<std::shared_ptr<AcceleratedOptimizer>> optimizers_;
  std::vector<std::shared_ptr<AcceleratedScheduler>> schedulers_;
  std::vector<std::shared_ptr<AcceleratedDataLoader>> dataloaders_;
  std::vector<std::shared_ptr<Checkpointable>> custom_;

  std::shared_ptr<std::map<int, SaveStatePreHook>> save_hooks_ = std::make_shared<std::map<int, SaveStatePreHook>>();
  std::shared_ptr<std::map<int, LoadStatePreHook>> load_hooks_ = std::make_shared<std::map<int, LoadStatePreHook>>();
  int next_hook_id_ = 0;

  std::unique_ptr<tracking::TrackerGroup> trackers_;
};

}  // namespace ember::distributed
