#include "accelerate/accelerator.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>

#include "accelerate/fsdp_env.h"
#include "accelerate/sharded_checkpoint.h"
#include "core/error.h"
#include "core/grad_mode.h"
#include "core/ops.h"
#include "core/rng.h"
#include "distributed/operations.h"
#include "distributed/overflow_agreement.h"
#include "nn/io/safetensors.h"
#include "nn/models/pretrained_model.h"
#include "optim/clip_grad.h"
#include "tracking/plot/html_report.h"

namespace fs = std::filesystem;

namespace ember::distributed {

namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

bool same_directory(fs::path a, fs::path b) {
  std::error_code ec1, ec2;
  return fs::equivalent(a, b, ec1) && !ec1 && !ec2;
}

}  // namespace

Accelerator::Accelerator(AcceleratorOptions options) : options_(std::move(options)) {
  apply_env_defaults();
  trackers_ = std::make_unique<tracking::TrackerGroup>(options_.log_with);  // unknown names first
  validate_options();
  state_ = AcceleratorState::initialize(options_.cpu, options_.timeout);
  gradient_state_ = std::make_shared<GradientState>(options_.gradient_accumulation_steps);
  gradient_state_->set_sync_with_dataloader(options_.sync_with_dataloader);
  // One scaler for every optimizer, agreeing on overflows across processes.
  if (options_.mixed_precision == "fp16")
    scaler_ = std::make_shared<optim::GradScaler>(options_.scaler, agree_on_overflow(state_->process_group().get()));
  if (options_.seed) set_seed(*options_.seed);
  heartbeat_ = std::make_unique<Heartbeat>(state_->process_index());
}

Accelerator::~Accelerator() {
  // A destructor must not throw: a tracker that cannot be closed is reported on stderr.
  try {
    end_training();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "Accelerator: closing the trackers failed: %s\n", e.what());
  }
}

void Accelerator::apply_env_defaults() {
  if (options_.mixed_precision == "no") {
    if (auto v = env("EMBER_MIXED_PRECISION")) options_.mixed_precision = *v;
  }
  if (options_.gradient_accumulation_steps == 1) {
    if (auto v = env("EMBER_GRADIENT_ACCUMULATION_STEPS")) {
      int n = 0;
      auto [ptr, ec] = std::from_chars(v->data(), v->data() + v->size(), n);
      EMBER_CHECK(ec == std::errc() && ptr == v->data() + v->size() && n >= 1,
                  "Accelerator: EMBER_GRADIENT_ACCUMULATION_STEPS='", *v, "' must be a positive integer");
      options_.gradient_accumulation_steps = n;
    }
  }
  if (!options_.cpu) {
    if (auto v = env("EMBER_USE_CPU")) {
      EMBER_CHECK(*v == "0" || *v == "1" || *v == "true" || *v == "false", "Accelerator: EMBER_USE_CPU='", *v,
                  "' must be 1 or 0");
      options_.cpu = *v == "1" || *v == "true";
    }
  }
  // `ember launch --use_fsdp`; options the program set win.
  if (!options_.fsdp) options_.fsdp = fsdp_options_from_env();
}

void Accelerator::validate_options() const {
  const auto& o = options_;
  EMBER_CHECK(o.mixed_precision == "no" || o.mixed_precision == "fp16" || o.mixed_precision == "bf16",
              "Accelerator: mixed_precision must be 'no', 'fp16' or 'bf16', got '", o.mixed_precision, "'");
  EMBER_CHECK(o.gradient_accumulation_steps >= 1, "Accelerator: gradient_accumulation_steps must be >= 1, got ",
              o.gradient_accumulation_steps);
  EMBER_CHECK(o.total_limit == -1 || o.total_limit >= 1, "Accelerator: total_limit must be -1 (keep all) or >= 1, got ",
              o.total_limit);
  EMBER_CHECK(o.timeout.count() > 0, "Accelerator: timeout must be positive");
  EMBER_CHECK(o.check_finite_loss == "no" || o.check_finite_loss == "warn" || o.check_finite_loss == "error",
              "Accelerator: check_finite_loss must be 'no', 'warn' or 'error', got '", o.check_finite_loss, "'");
  EMBER_CHECK(o.log_with.empty() || !o.project_dir.empty(),
              "Accelerator: log_with needs project_dir (runs are written to <project_dir>/<project_name>/)");
  EMBER_CHECK(o.checkpoint_every_n_steps >= 0, "Accelerator: checkpoint_every_n_steps must be >= 0, got ",
              o.checkpoint_every_n_steps);
  EMBER_CHECK(std::isfinite(o.checkpoint_every_seconds) && o.checkpoint_every_seconds >= 0,
              "Accelerator: checkpoint_every_seconds must be a finite number >= 0, got ", o.checkpoint_every_seconds);
  EMBER_CHECK((o.checkpoint_every_n_steps == 0 && o.checkpoint_every_seconds == 0) || !o.project_dir.empty(),
              "Accelerator: checkpoint_every_n_steps / checkpoint_every_seconds need project_dir (automatic "
              "checkpoints are written to <project_dir>/checkpoints/checkpoint_<n>)");
}

// ---- experiment tracking

void Accelerator::init_trackers(const std::string& project_name, const TrackerConfig& config) {
  trackers_->start(options_.project_dir, project_name, config, is_main_process());
}

void Accelerator::log(const LogValues& values, std::optional<int64_t> step) { trackers_->log(values, step); }

void Accelerator::end_training() {
  if (!trackers_ || !trackers_->active()) return;
  // The run's curves, as `ember plot RUN_DIR` draws them, next to its logs.
  const bool report = trackers_->get("jsonl") != nullptr && trackers_->log_calls() > 0;
  const std::string run_dir = trackers_->run_dir();
  trackers_->finish();
  if (report) plot::write_html_report({run_dir}, run_dir + "/report.html");
}

bool Accelerator::optimizer_step_was_skipped() const {
  for (const auto& o : optimizers_)
    if (o->step_was_skipped()) return true;
  return false;
}

// ---- prepare

void Accelerator::prepare_model(const std::shared_ptr<nn::Module>& model) {
  EMBER_CHECK(model != nullptr, "Accelerator::prepare: the model is null");
  for (const auto& m : models_)
    if (m == model) return;  // prepared already
  if (!device().is_cpu()) model->to(device());
  // Accelerate's convert_outputs_to_fp32: models that support it return f32 under autocast.
  if (options_.mixed_precision != "no") model->set_convert_outputs_to_f32(true);
  std::shared_ptr<DistributedDataParallel> wrapper;
  std::shared_ptr<FullyShardedDataParallel> sharded;
  if (num_processes() > 1 && options_.fsdp) {
    // An optimizer prepared earlier would keep stepping the unsharded parameters.
    for (const auto& o : optimizers_)
      for (const auto& g : o->param_groups())
        for (const auto& p : g.params)
          for (const auto& q : model->parameters())
            EMBER_CHECK(p.impl() != q.impl(), "Accelerator::prepare: under fsdp, prepare a model before its optimizer "
                        "(pass the model first): the optimizer must be given the parameters' shards");
    const std::optional<DType> pd = options_.fsdp->mixed_precision.param_dtype;
    const std::string& mp = options_.mixed_precision;
    EMBER_CHECK(!pd || *pd == DType::f32 || (*pd == DType::bf16 && mp == "bf16") || (*pd == DType::f16 && mp == "fp16"),
                "Accelerator::prepare: fsdp param_dtype ", pd ? dtype_name(*pd) : "", " needs mixed_precision '",
                pd && *pd == DType::f16 ? "fp16" : "bf16", "' (the forward runs under its autocast), got '", mp, "'");
    sharded = FullyShardedDataParallel::create(model, state_->process_group(), *options_.fsdp);
  } else if (num_processes() > 1) {
    wrapper = std::make_shared<DistributedDataParallel>(model, state_->process_group(), options_.ddp);
    sync_buffers_before_forward(*model, wrapper);
  }
  models_.push_back(model);
  ddps_.push_back(std::move(wrapper));
  fsdps_.push_back(std::move(sharded));
}

// The user calls the model's own forward, not the wrapper's, so DDP's buffer broadcast rides on
// a pre hook. As torch's DDP, it runs only in a training forward that records gradients and
// will synchronise them: not under no_grad (an evaluation on rank 0 alone must not wait for
// the others) and not inside no_sync()/accumulate() micro-steps.
void Accelerator::sync_buffers_before_forward(nn::Module& model, const std::shared_ptr<DistributedDataParallel>& ddp) {
  if (!options_.ddp.broadcast_buffers || model.named_buffers().empty()) return;
  std::weak_ptr<DistributedDataParallel> weak = ddp;
  model.register_forward_pre_hook([weak](nn::Module& m) {
    auto wrapper = weak.lock();
    if (wrapper && m.is_training() && GradMode::is_enabled() && wrapper->require_backward_grad_sync())
      wrapper->sync_buffers();
  });
}

std::shared_ptr<AcceleratedOptimizer> Accelerator::prepare_optimizer(std::shared_ptr<optim::Optimizer> opt) {
  EMBER_CHECK(opt != nullptr, "Accelerator::prepare: the optimizer is null");
  shard_parameter_groups(*opt);
  const bool in_backward = overlap_with_ddp(opt);
  auto wrapped = std::make_shared<AcceleratedOptimizer>(std::move(opt), gradient_state_, scaler_);
  wrapped->set_stepped_in_backward(in_backward);
  if (std::any_of(fsdps_.begin(), fsdps_.end(), [](const auto& f) { return f != nullptr; })) {
    // Sharded models: the step updated this rank's slices; gather the rest for the next forward.
    std::weak_ptr<GradientState> alive = gradient_state_;
    wrapped->set_after_step([this, alive] {
      if (alive.expired()) return;
      for (const auto& f : fsdps_)
        if (f) f->sync_parameters();
    });
  }
  optimizers_.push_back(wrapped);
  return wrapped;
}

bool Accelerator::overlap_with_ddp(const std::shared_ptr<optim::Optimizer>& opt) {
  if (!options_.overlap_optimizer_step || num_processes() == 1) return false;
  const char* who = "Accelerator::prepare: overlap_optimizer_step";
  EMBER_CHECK(!options_.fsdp, who, " works with DDP; sharded models step their shards after backward");
  EMBER_CHECK(scaler_ == nullptr, who, " cannot run with fp16 loss scaling (the step would come before the "
              "scaler could unscale and check the gradients); use bf16 or turn the overlap off");
  // The one DDP model that holds the optimizer's parameters steps them.
  DistributedDataParallel* owner = nullptr;
  for (const auto& d : ddps_) {
    if (!d) continue;
    const std::vector<Tensor> mine = d->module()->parameters();
    for (const auto& g : opt->param_groups())
      for (const auto& p : g.params)
        if (std::any_of(mine.begin(), mine.end(), [&](const Tensor& q) { return q.is_same(p); })) {
          EMBER_CHECK(owner == nullptr || owner == d.get(), who, ": the optimizer steps parameters of two prepared "
                      "models; give each model its own optimizer");
          owner = d.get();
        }
  }
  EMBER_CHECK(owner != nullptr, who, ": none of the optimizer's parameters belongs to a prepared model; prepare the "
              "model before its optimizer");
  owner->overlap_optimizer_step(opt);
  return true;
}

std::shared_ptr<AcceleratedDataLoader> Accelerator::prepare_one(const std::shared_ptr<data::DataLoader>& loader) {
  EMBER_CHECK(loader != nullptr, "Accelerator::prepare: the data loader is null");
  return prepare_data_loader(*loader);
}

std::shared_ptr<AcceleratedDataLoader> Accelerator::prepare_data_loader(const data::DataLoader& loader) {
  data::ShardOptions shard;
  shard.num_processes = num_processes();
  shard.process_index = process_index();
  shard.split_batches = options_.split_batches;
  shard.even_batches = options_.even_batches;
  auto wrapped = std::make_shared<AcceleratedDataLoader>(loader, shard, gradient_state_, device());
  if (num_processes() > 1) agree_on_drawn_seed(*wrapped);
  dataloaders_.push_back(wrapped);
  return wrapped;
}

void Accelerator::agree_on_drawn_seed(AcceleratedDataLoader& loader) const {
  // A seed drawn from the generator may differ between processes (set_seed with
  // device_specific, or different random work before the loader was built); shards of
  // different orders would overlap, so every process takes process 0's, as Accelerate
  // synchronises the generators its samplers draw from.
  const data::Sampler& sampler = loader.shard().sampler();
  const std::optional<uint64_t> mine = sampler.seed_was_drawn() ? sampler.seed() : std::nullopt;
  const std::vector<std::string> all = gather_object(mine ? std::to_string(*mine) : std::string());
  // Compared with process 0's, so that every process raises the same error.
  for (size_t r = 1; r < all.size(); ++r)
    EMBER_CHECK(all[r].empty() == all[0].empty(), "prepare: data loader ", dataloaders_.size(),
                all[0].empty() ? " has a seed given in its options (or does not shuffle) on process 0 but draws it"
                                 " from the generator on process "
                               : " draws its shuffle seed from the generator on process 0 but not on process ",
                r, ": build the loader the same way on every process");
  if (!mine) return;
  const uint64_t seed = std::stoull(all[0]);
  if (seed != *mine) loader.use_seed(seed);
}

std::shared_ptr<AcceleratedScheduler> Accelerator::prepare_scheduler(std::shared_ptr<optim::LRScheduler> sched) {
  EMBER_CHECK(sched != nullptr, "Accelerator::prepare: the scheduler is null");
  auto wrapped = std::make_shared<AcceleratedScheduler>(std::move(sched), optimizers_, gradient_state_,
                                                        num_processes(), options_.step_scheduler_with_optimizer,
                                                        options_.split_batches);
  schedulers_.push_back(wrapped);
  return wrapped;
}

bool Accelerator::is_prepared(const nn::Module& model) const {
  for (const auto& m : models_)
    if (m.get() == &model) return true;
  return false;
}

ForwardAutocast Accelerator::forward_autocast() const {
  const std::string& mp = options_.mixed_precision;
  if (mp == "no" || !options_.autocast_prepared_model) return {};
  return {true, device().type, mp == "fp16" ? DType::f16 : DType::bf16};
}

std::shared_ptr<DistributedDataParallel> Accelerator::ddp(const nn::Module& model) const {
  for (size_t i = 0; i < models_.size(); ++i)
    if (models_[i].get() == &model) return ddps_[i];
  return nullptr;
}

std::shared_ptr<FullyShardedDataParallel> Accelerator::fsdp(const nn::Module& model) const {
  for (size_t i = 0; i < models_.size(); ++i)
    if (models_[i].get() == &model) return fsdps_[i];
  return nullptr;
}

void Accelerator::shard_parameter_groups(optim::Optimizer& opt) const {
  if (std::all_of(fsdps_.begin(), fsdps_.end(), [](const auto& f) { return f == nullptr; })) return;
  const optim::OptimizerStateDict sd = opt.state_dict();
  EMBER_CHECK(sd.tensors.empty(), "Accelerator::prepare: under fsdp the optimizer must not have stepped yet (it ",
              "holds state for the unsharded parameters); build it fresh and prepare it after its model");
  for (optim::ParamGroup& g : opt.param_groups())
    for (Tensor& p : g.params)
      for (const auto& f : fsdps_)
        if (f) {
          Tensor shard = f->shard_of(p);
          if (shard.defined()) {
            p = shard;
            break;
          }
        }
}

// ---- training step

void Accelerator::check_loss(const Tensor& loss, const char* op) {
  ++backward_calls_;
  heartbeat_->beat(backward_calls_);
  if (options_.check_finite_loss == "no") return;
  double v = 0;
  {
    NoGradGuard no_grad;
    const Tensor d = loss.detach().to(DType::f64);
    v = d.numel() == 1 ? d.item<double>() : sum(d).item<double>();
  }
  if (std::isfinite(v)) return;
  ++nonfinite_losses_;
  const std::string what = std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  std::string msg = std::string(op) + ": non-finite loss (" + what + ") at step " + std::to_string(backward_calls_);
  if (num_processes() > 1) msg += " on process " + std::to_string(process_index());
  if (options_.check_finite_loss == "error") throw Error(msg);
  std::fprintf(stderr, "ember: warning: %s\n", msg.c_str());
  std::fflush(stderr);
}

void Accelerator::backward(const Tensor& loss) {
  EMBER_CHECK(loss.defined(), "Accelerator::backward: the loss is undefined");
  check_loss(loss, "Accelerator::backward");
  const int k = options_.gradient_accumulation_steps;
  const Tensor averaged = k == 1 ? loss : loss * (1.0 / double(k));
  (scaler_ ? scaler_->scale(averaged) : averaged).backward();
}

void Accelerator::backward_token_sum(const Tensor& loss_sum, int64_t global_tokens) {
  EMBER_CHECK(loss_sum.defined(), "Accelerator::backward_token_sum: the loss is undefined");
  EMBER_CHECK(global_tokens > 0, "Accelerator::backward_token_sum: global_tokens must be > 0, got ", global_tokens);
  check_loss(loss_sum, "Accelerator::backward_token_sum");
  const Tensor loss = loss_sum * (double(num_processes()) / double(global_tokens));
  (scaler_ ? scaler_->scale(loss) : loss).backward();
}

int64_t Accelerator::global_token_count(int64_t local_count) {
  EMBER_CHECK(local_count >= 0, "Accelerator::global_token_count: the count must be >= 0, got ", local_count);
  if (num_processes() == 1) return local_count;
  Tensor t = from_vector<int64_t>({local_count}, {1});
  return distributed::reduce(t, "sum", process_group()).item<int64_t>();
}

int64_t Accelerator::global_token_count(const std::vector<Tensor>& masks) {
  int64_t local = 0;
  NoGradGuard no_grad;
  for (const auto& m : masks) {
    EMBER_CHECK(m.defined(), "Accelerator::global_token_count: a mask is undefined");
    local += int64_t(sum(m.to(DType::boolean).to(DType::f64)).item<double>());
  }
  return global_token_count(local);
}

Accelerator::SyncGuard Accelerator::accumulate_models(std::vector<const nn::Module*> models) {
  if (gradient_state_->sync_with_dataloader() && gradient_state_->end_of_dataloader()) {
    step_ = 0;
    gradient_state_->set_sync_gradients(true);
  } else {
    ++step_;
    gradient_state_->set_sync_gradients(step_ % options_.gradient_accumulation_steps == 0);
  }
  SyncGuard guard;
  if (gradient_state_->sync_gradients() || num_processes() == 1 || options_.sync_each_batch) return guard;
  if (models.empty())
    for (const auto& m : models_) models.push_back(m.get());
  guard.guards_.reserve(models.size());
  for (const nn::Module* m : models) {
    if (auto d = ddp(*m)) guard.guards_.push_back(d->no_sync());
    if (auto f = fsdp(*m)) guard.sharded_guards_.push_back(f->no_sync());
  }
  return guard;
}

Accelerator::SyncGuard Accelerator::no_sync(const nn::Module& model) {
  SyncGuard guard;
  if (auto d = ddp(model)) guard.guards_.push_back(d->no_sync());
  if (auto f = fsdp(model)) guard.sharded_guards_.push_back(f->no_sync());
  return guard;
}

AutocastGuard Accelerator::autocast() const {
  const std::string& mp = options_.mixed_precision;
  const DeviceType d = device().type;
  // "no" leaves whatever scope the caller is in as it is (Accelerate's nullcontext).
  if (mp == "no") return AutocastGuard(d, autocast_dtype(d), autocast_enabled(d));
  return AutocastGuard(d, mp == "fp16" ? DType::f16 : DType::bf16);
}

void Accelerator::unscale_gradients() {
  if (!scaler_) return;
  for (const auto& o : optimizers_)
    if (!scaler_->is_unscaled(o->optimizer())) scaler_->unscale_(o->optimizer());
}

void Accelerator::check_not_stepped_in_backward(const char* op) const {
  for (const auto& o : optimizers_)
    EMBER_CHECK(!o->stepped_in_backward(), "Accelerator::", op, ": under overlap_optimizer_step the optimizer "
                "stepped during backward, before gradients could be clipped; turn the overlap off to clip");
}

double Accelerator::clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  check_not_stepped_in_backward("clip_grad_norm_");
  if (!sync_gradients()) {
    // Mid-window the gradients stay scaled (more will be added to them); norms scale linearly.
    const double norm = optim::clip_grad_norm_(params, std::numeric_limits<double>::infinity(), norm_type);
    return scaler_ ? norm / scaler_->get_scale() : norm;
  }
  unscale_gradients();
  // A sharded model's gradients live in its shards: its norm is taken across ranks.
  for (const auto& f : fsdps_)
    if (f && !params.empty() && f->shard_of(params.front()).defined()) {
      EMBER_CHECK(params.size() == f->module()->parameters().size(), "Accelerator::clip_grad_norm_: under fsdp pass ",
                  "all of a sharded model's parameters (model->parameters()); a subset cannot be clipped per shard");
      return f->clip_grad_norm_(max_norm, norm_type);
    }
  return optim::clip_grad_norm_(params, max_norm, norm_type);
}

void Accelerator::clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  check_not_stepped_in_backward("clip_grad_value_");
  if (!sync_gradients()) return;
  unscale_gradients();
  optim::clip_grad_value_(params, clip_value);
}

// ---- collectives

Tensor Accelerator::gather(const Tensor& tensor) const { return distributed::gather(tensor, process_group()); }

Tensor Accelerator::gather_for_metrics(const Tensor& tensor) const { return drop_padding(gather(tensor)); }

Tensor Accelerator::drop_padding(const Tensor& all) const {
  const GradientState& gs = *gradient_state_;
  if (!gs.end_of_dataloader() || gs.padding_samples() == 0) return all;
  // Only a per-sample tensor of the padded last step carries duplicates.
  if (all.size(0) != gs.total_batch_size()) return all;
  return all.narrow(0, 0, gs.remainder()).contiguous();
}

Tensor Accelerator::reduce(const Tensor& tensor, const std::string& reduction, double scale) const {
  return distributed::reduce(tensor, reduction, process_group(), scale);
}

Tensor Accelerator::pad_across_processes(const Tensor& tensor, int64_t dim, double pad_index, bool pad_first) const {
  return distributed::pad_across_processes(tensor, process_group(), dim, pad_index, pad_first);
}

Tensor Accelerator::broadcast(const Tensor& tensor, int from) const {
  return distributed::broadcast(tensor, process_group(), from);
}

std::vector<std::string> Accelerator::gather_object(const std::string& mine) const {
  return distributed::gather_object(mine, process_group());
}

std::string Accelerator::broadcast_object(const std::string& value, int from) const {
  return distributed::broadcast_object(value, process_group(), from);
}

std::pair<int64_t, int64_t> Accelerator::split_between_processes(int64_t count) const {
  EMBER_CHECK(count >= 0, "Accelerator::split_between_processes: count must be >= 0, got ", count);
  const int64_t r = process_index(), n = num_processes();
  const int64_t per = count / n, extra = count % n;
  const int64_t begin = r * per + std::min(r, extra);
  return {begin, begin + per + (r < extra ? 1 : 0)};
}

Accelerator::ProcessOrderGuard::ProcessOrderGuard(const AcceleratorState* state, bool goes_first)
    : state_(state), goes_first_(goes_first) {
  if (!goes_first_) state_->wait_for_everyone();
}

Accelerator::ProcessOrderGuard::~ProcessOrderGuard() noexcept(false) {
  // While an exception unwinds, the peers will fail on their own timeout instead.
  if (state_ && goes_first_ && std::uncaught_exceptions() == 0) state_->wait_for_everyone();
}

void Accelerator::set_seed(uint64_t seed, bool device_specific) {
  manual_seed(device_specific ? seed + uint64_t(process_index()) : seed);
}

// ---- saving

void Accelerator::on_main_process(const std::string& what, const std::function<void()>& fn) const {
  std::string error;
  if (is_main_process()) {
    try {
      fn();
    } catch (const std::exception& e) {
      error = e.what();
      if (error.empty()) error = "unknown error";
    }
  }
  if (num_processes() > 1) {
    const std::vector<std::string> all = gather_object(error);
    if (!all[0].empty() && !is_main_process()) EMBER_FAIL(what, ": the main process failed: ", all[0]);
  }
  if (!error.empty()) throw Error(error);
}

void Accelerator::save_model(const nn::Module& model, const std::string& dir) {
  // A sharded model is gathered whole on every process while the main process writes it.
  std::optional<FullyShardedDataParallel::FullParamsGuard> whole;
  if (auto f = fsdp(model)) whole.emplace(f->summon_full_params(false));
  on_main_process("save_model", [&] {
    fs::create_directories(dir);
    // A model that knows its Hugging Face config saves itself (config.json + weights).
    if (const auto* pretrained = dynamic_cast<const nn::PretrainedModel*>(&model)) {
      pretrained->save_pretrained(dir);
    } else {
      nn::save_safetensors(dir + "/model.safetensors", model.state_dict(), {{"format", "pt"}});
    }
  });
}

void Accelerator::save(const nn::StateDict& state_dict, const std::string& path) {
  on_main_process("save", [&] { nn::save_safetensors(path, state_dict, {{"format", "pt"}}); });
}

void Accelerator::save(const ObjectState& state, const std::string& path) {
  on_main_process("save", [&] {
    std::map<std::string, std::string> metadata{{"format", "ember"}};
    for (const auto& [k, v] : state.scalars) {
      std::ostringstream os;
      os.precision(17);
      os << v;
      metadata["scalar." + k] = os.str();
    }
    nn::save_safetensors(path, state.tensors, metadata);
  });
}

void Accelerator::set_save_iteration(int64_t n) {
  EMBER_CHECK(n >= 0, "Accelerator::set_save_iteration: n must be >= 0, got ", n);
  save_iteration_ = n;
}

std::string Accelerator::save_state(const std::string& dir) {
  std::string out = dir;
  const bool automatic = dir.empty();
  if (automatic) {
    EMBER_CHECK(!options_.project_dir.empty(),
                "save_state: no directory given and AcceleratorOptions::project_dir is empty");
    const std::string root = checkpoints_root(options_.project_dir);
    out = (fs::path(root) / checkpoint_dir_name(save_iteration_)).string();
    // Numbers only grow: a lower one would be the first to go in the rotation.
    const auto existing = list_checkpoints(root);
    EMBER_CHECK(!fs::exists(out) && (existing.empty() || existing.back().first < save_iteration_), "save_state: ",
                root, " already holds ", fs::path(existing.empty() ? out : existing.back().second).filename().string(),
                ", so the next automatic checkpoint cannot be ", checkpoint_dir_name(save_iteration_),
                "; load_state() to continue that run, or choose the next number with set_save_iteration()");
  }
  std::vector<std::shared_ptr<nn::Module>> models = models_;
  // A sharded model has no whole state on any process: it is saved in pieces, every process its
  // own (sharded_checkpoint.h), and its hooks see an empty state; under FULL_STATE_DICT it is
  // gathered and saved whole instead.
  CheckpointPayload payload;
  std::vector<nn::StateDict> weights;
  for (size_t i = 0; i < models.size(); ++i) {
    const bool whole = saves_whole(fsdps_[i].get());
    const bool pieces = saves_in_pieces(fsdps_[i].get()) && !whole;
    nn::StateDict state;
    if (whole)
      for (auto& [name, t] : fsdps_[i]->full_state_dict()) state[name] = t;
    else if (!pieces)
      state = models[i]->state_dict();
    weights.push_back(std::move(state));
    payload.sharded_models.push_back(pieces);
    payload.model_pieces.push_back(pieces ? std::optional(model_pieces(*fsdps_[i], is_main_process())) : std::nullopt);
  }
  for (auto& [id, hook] : *save_hooks_) hook(models, weights, out);
  if (is_main_process()) payload.models = std::move(weights);
  // Under sharding each process's optimizer holds its own shards' state: every process saves it,
  // unless every sharded model saves whole, which gathers it whole.
  const bool sharded = std::any_of(fsdps_.begin(), fsdps_.end(),
                                   [](const auto& f) { return saves_in_pieces(f.get()) && !saves_whole(f.get()); });
  const bool gathered = !sharded && std::any_of(fsdps_.begin(), fsdps_.end(), [](const auto& f) { return saves_whole(f.get()); });
  for (const auto& o : optimizers_) {
    optim::OptimizerStateDict sd = o->state_dict();
    if (gathered) sd = whole_optimizer_state(sd, optimizer_slots(o->optimizer(), fsdps_), *state_->process_group());
    payload.sharded_optimizers.push_back(sharded);
    payload.optimizer_pieces.push_back(
        sharded ? std::optional(optimizer_pieces(sd, optimizer_slots(o->optimizer(), fsdps_))) : std::nullopt);
    if (sharded) sd.tensors.clear();  // they are in the pieces
    payload.optimizers.push_back(detail::to_object_state(std::move(sd)));
  }
  for (const auto& s : schedulers_) payload.schedulers.push_back(detail::to_object_state(s->state_dict()));
  for (const auto& c : custom_) payload.custom.push_back(c->state_dict());
  for (const auto& l : dataloaders_) payload.dataloaders.push_back(l->state());
  if (scaler_) payload.scaler = detail::to_object_state(scaler_->state_dict());
  payload.rng = default_generator().get_state();
  payload.accumulation_step = step_;
  payload.save_iteration = save_iteration_;
  payload.backward_passes = backward_calls_;
  write_checkpoint(out, payload, *state_);

  if (automatic) {
    ++save_iteration_;
    restart_checkpoint_policy();
    on_main_process("save_state", [&] { rotate_checkpoints(checkpoints_root(options_.project_dir), options_.total_limit); });
  }
  return out;
}

std::string Accelerator::resolve_load_dir(const std::string& dir) const {
  if (!dir.empty()) return dir;
  EMBER_CHECK(!options_.project_dir.empty(), "load_state: no directory given and AcceleratorOptions::project_dir is empty");
  const std::string root = checkpoints_root(options_.project_dir);
  const auto all = list_checkpoints(root);
  return all.empty() ? std::string() : all.back().second;
}

void Accelerator::restart_checkpoint_policy() {
  steps_since_checkpoint_ = 0;
  last_checkpoint_time_ = std::chrono::steady_clock::now();
}

std::optional<std::string> Accelerator::maybe_save_state() {
  const auto& o = options_;
  if (o.checkpoint_every_n_steps == 0 && o.checkpoint_every_seconds == 0) return std::nullopt;
  if (!sync_gradients()) return std::nullopt;
  ++steps_since_checkpoint_;
  bool due = o.checkpoint_every_n_steps > 0 && steps_since_checkpoint_ >= o.checkpoint_every_n_steps;
  if (o.checkpoint_every_seconds > 0) {
    const std::chrono::duration<double> since = std::chrono::steady_clock::now() - last_checkpoint_time_;
    int64_t late = since.count() >= o.checkpoint_every_seconds ? 1 : 0;
    // Clocks differ between processes: all follow process 0, or some would save and the others not.
    if (num_processes() > 1)
      late = distributed::broadcast(from_vector<int64_t>({late}, {1}), process_group(), 0).item<int64_t>();
    due = due || late != 0;
  }
  if (!due) return std::nullopt;
  return save_state();
}

std::string Accelerator::load_state(const std::string& dir) {
  std::string in = resolve_load_dir(dir);
  // A fresh start: nothing saved yet under project_dir. Every process must see the same
  // directory, so they agree on whether there is anything to load.
  if (num_processes() > 1 && dir.empty()) {
    const std::vector<std::string> seen = gather_object(in);
    for (size_t r = 1; r < seen.size(); ++r)
      EMBER_CHECK(seen[r] == seen[0], "load_state: process 0 resumes from '", seen[0].empty() ? "nothing" : seen[0],
                  "' but process ", r, " from '", seen[r].empty() ? "nothing" : seen[r],
                  "' (project_dir must be the same shared directory on every process)");
  }
  if (in.empty()) return in;
  while (in.size() > 1 && in.back() == '/') in.pop_back();
  std::vector<std::shared_ptr<nn::Module>> models = models_;
  for (auto& [id, hook] : *load_hooks_) hook(models, in);

  CheckpointTargets targets;
  for (const auto& m : models) targets.models.push_back(m.get());
  for (const auto& o : optimizers_) targets.optimizers.push_back(&o->optimizer());
  for (const auto& s : schedulers_) targets.schedulers.push_back(&s->scheduler());
  for (const auto& c : custom_) targets.custom.push_back(c.get());
  for (const auto& l : dataloaders_) targets.dataloaders.push_back(l.get());
  targets.scaler = scaler_.get();
  targets.scaler_options = options_.scaler;
  for (const auto& f : fsdps_) targets.model_shardings.push_back(f.get());
  for (const auto& o : optimizers_) targets.optimizer_slots.push_back(optimizer_slots(o->optimizer(), fsdps_));
  // Two phases: every file of the checkpoint is read and checked on every process, and only
  // when all of them accepted does anything change.
  const CheckpointPayload saved = read_and_validate_checkpoint(in, targets, *state_);
  apply_checkpoint(saved, targets, *state_);
  step_ = saved.accumulation_step;
  backward_calls_ = saved.backward_passes;
  heartbeat_->set_resumed_from(backward_calls_);
  heartbeat_->beat(backward_calls_);
  restart_checkpoint_policy();
  if (!options_.project_dir.empty() && same_directory(fs::path(in).parent_path(), checkpoints_root(options_.project_dir)))
    save_iteration_ = saved.save_iteration + 1;
  return in;
}

RemovableHandle Accelerator::register_save_state_pre_hook(SaveStatePreHook hook) {
  const int id = next_hook_id_++;
  (*save_hooks_)[id] = std::move(hook);
  std::weak_ptr<std::map<int, SaveStatePreHook>> hooks = save_hooks_;
  return RemovableHandle([hooks, id] {
    if (auto h = hooks.lock()) h->erase(id);
  });
}

RemovableHandle Accelerator::register_load_state_pre_hook(LoadStatePreHook hook) {
  const int id = next_hook_id_++;
  (*load_hooks_)[id] = std::move(hook);
  std::weak_ptr<std::map<int, LoadStatePreHook>> hooks = load_hooks_;
  return RemovableHandle([hooks, id] {
    if (auto h = hooks.lock()) h->erase(id);
  });
}

}  // namespace ember::distributed
