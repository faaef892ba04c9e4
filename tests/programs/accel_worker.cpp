// One process of an Accelerator job, started by tests/accelerate/test_accelerator_processes.cpp
// (directly with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, through `ember launch`, or with no
// environment at all for a single process):
//
//   accel_worker ddp <steps> <batch>              prepared DDP training == one process on the
//                                                 concatenated batches; prints "ddp ok"
//   accel_worker accum <steps> <batch> [overlap]  4 micro-batches under accumulate() == one 4x
//                                                 batch, scheduler counts; prints "accum ok"
//                                                 (overlap: the optimizer stepped by DDP in
//                                                 backward, clipping refused; "accum overlap ok")
//   accel_worker metrics <n> <batch> <split>      gather_for_metrics sees every sample once, in
//                                                 order; other collectives; prints "metrics ok"
//   accel_worker train <project> <out> <total> <stop_at> <resume>
//                                                 training with checkpoints: stops after
//                                                 <stop_at> micro-steps (save_state), or resumes
//                                                 from the latest checkpoint; writes the final
//                                                 weights to <out>; prints "train ok"
//   accel_worker amp                              fp16: only the last rank gets an inf gradient,
//                                                 and every rank skips that step (the scaler's
//                                                 found-inf flag is agreed across processes),
//                                                 then steps together; prints "amp ok"
//   accel_worker amp_sharded                      the same under FULL_SHARD with an f16 param_dtype:
//                                                 an inf in one rank's shard gradient skips the
//                                                 step everywhere;
//                                                 prints "amp sharded ok"
//   accel_worker structures <dir>                 collectives on tuples, vectors and Batches,
//                                                 pad_across_processes along one dim, loaders
//                                                 seeded by set_seed, save_pretrained written
//                                                 once under <dir>, print, a bf16 prepared
//                                                 model; prints "structures ok"
//   accel_worker fsdp <strategy> <steps> <batch> <dir> [sync_each_batch]
//                                                 the accum run under AcceleratorOptions::fsdp
//                                                 (reducing every micro-batch when asked)
//                                                 with that sharding strategy, clipping across
//                                                 shards, then save_state/load_state in <dir>
//                                                 repeats a step exactly; prints "fsdp ok".
//                                                 <strategy> "launcher": the options come from
//                                                 `ember launch --use_fsdp ...` (EMBER_FSDP_*)
//   accel_worker main_only_gather                 the classic hang: gather_for_metrics under
//                                                 is_main_process, wait_for_everyone on every
//                                                 rank; each rank must fail within seconds,
//                                                 naming both collectives; prints "main only ok"
// Exit status 0 when every expectation held.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <cstdlib>
#include <string>

#include "accelerate/accelerator.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "ddp_test_model.h"
#include "distributed/overflow_agreement.h"
#include "nn/models/pretrained.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd_adam.h"
#include "small_bert.h"
#include "worker_expect.h"

using namespace ember;
using namespace ember::distributed;
using namespace ember::ddp_test;

namespace {

using ember::testing::expect;
bool& failed = ember::testing::worker_failed();

// n samples of the Mlp's regression problem, with their index.
std::shared_ptr<data::TensorDataset> make_dataset(int64_t n, uint64_t seed) {
  return std::make_shared<data::TensorDataset>(std::map<std::string, Tensor>{
      {"x", uniform_tensor(seed, {n, kIn})}, {"y", uniform_tensor(seed + 1, {n, kOut})}, {"idx", arange(n)}});
}

Tensor loss_of(nn::Module& model, Batch& batch) { return nn::functional::mse_loss(model.forward(batch["x"]), batch["y"]); }

constexpr int64_t kWarmup = 2;

// One process on batches of `batch` rows for `steps` optimizer steps: the reference.
std::shared_ptr<Mlp> train_reference(const std::shared_ptr<data::TensorDataset>& ds, int64_t batch, int64_t steps,
                                      double* last_lr) {
  auto model = make_mlp(1);
  optim::AdamW opt(model->parameters(), {.lr = 0.01});
  auto sched = optim::get_scheduler("linear", opt, kWarmup, 2 * steps);  // ends at half the schedule
  data::DataLoader loader(ds, {.batch_size = batch, .shuffle = true, .seed = 5});
  int64_t done = 0;
  for (auto& b : loader) {
    loss_of(*model, b).backward();
    opt.step();
    sched->step();
    opt.zero_grad();
    if (++done == steps) break;
  }
  *last_lr = sched->get_last_lr()[0];
  return model;
}

int run_ddp(int64_t steps, int64_t b) {
  Accelerator acc;
  const int R = acc.num_processes();
  auto ds = make_dataset(steps * R * b, 100);
  double ref_lr = 0;
  auto reference = train_reference(ds, R * b, steps, &ref_lr);

  auto model = make_mlp(1 + uint64_t(acc.process_index()));  // DDP starts every rank from rank 0's weights
  optim::AdamW opt(model->parameters(), {.lr = 0.01});
  // Written for one process reading the per-process loader: R times as many steps.
  auto sched = optim::get_scheduler("linear", opt, kWarmup * R, 2 * steps * R);
  data::DataLoader loader(ds, {.batch_size = b, .shuffle = true, .seed = 5});
  auto [m, o, l, s] = acc.prepare(model, opt, loader, sched);
  expect(m == model, "prepare returns the same model");
  expect(l->size() == steps, "each process gets steps batches, got " + std::to_string(l->size()));
  for (auto& batch : *l) {
    acc.backward(loss_of(*m, batch));
    o->step();
    s->step();
    o->zero_grad();
  }
  const double diff = max_abs_diff(*model, *reference);
  const double moved = max_abs_diff(*reference, *make_mlp(1));
  std::printf("rank %d ddp: max abs diff %.3g, moved %.3g, lr %.6g vs %.6g\n", acc.process_index(), diff, moved,
              s->get_last_lr()[0], ref_lr);
  expect(diff <= 1e-5, "parameters match the one-process run");
  expect(moved > 1e-3, "training moved the parameters");
  expect(std::abs(s->get_last_lr()[0] - ref_lr) < 1e-12, "learning rate matches the one-process schedule");
  expect(s->last_step() == steps * R, "scheduler stepped num_processes times per step");
  acc.wait_for_everyone();
  if (!failed) std::printf("ddp ok\n");
  return failed ? 1 : 0;
}

// Copies of a model's values (state_dict() hands out the live tensors).
std::map<std::string, std::vector<float>> values_of(const nn::Module& model) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, t] : model.state_dict()) out[name] = t.to_vector<float>();
  return out;
}

// The accumulation run of run_accum under sharded data parallel: the loop body is unchanged,
// the Accelerator shards the model, rewrites the optimizer to the shards, gathers after each
// step and clips across shards.
int run_fsdp(const std::string& strategy, int64_t steps, int64_t b, const std::string& dir, bool sync_each_batch) {
  constexpr int K = 2;
  std::optional<FSDPOptions> chosen;
  if (strategy != "launcher") {
    chosen = FSDPOptions{};
    chosen->sharding_strategy = parse_sharding_strategy(strategy);
    chosen->transformer_layer_cls_to_wrap = {"Linear"};
  }
  Accelerator acc({.gradient_accumulation_steps = K, .fsdp = chosen, .sync_each_batch = sync_each_batch});
  expect(acc.options().fsdp.has_value(), "the Accelerator shards (from its options or the launcher's variables)");
  const FSDPOptions fsdp = acc.options().fsdp.value_or(FSDPOptions{});
  const int R = acc.num_processes();
  auto ds = make_dataset(steps * K * R * b, 200);
  double ref_lr = 0;
  auto reference = train_reference(ds, K * R * b, steps, &ref_lr);

  auto model = make_mlp(1);
  optim::AdamW opt(model->parameters(), {.lr = 0.01});
  auto sched = optim::get_scheduler("linear", opt, kWarmup * R, 2 * steps * R);
  data::DataLoader loader(ds, {.batch_size = b, .shuffle = true, .seed = 5});
  auto [m, o, l, s] = acc.prepare(model, opt, loader, sched);
  int64_t shard_numel = 0;
  for (auto& p : o->param_groups()[0].params) shard_numel += p.numel();
  double last_norm = 0;
  for (auto& batch : *l) {
    auto guard = acc.accumulate(m);
    acc.backward(loss_of(*m, batch));
    // A bound no gradient reaches: the norm is taken, nothing is scaled.
    if (acc.sync_gradients()) last_norm = acc.clip_grad_norm_(model->parameters(), 1e9);
    o->step();
    s->step();
    o->zero_grad();
  }
  // Every unit reduces once per window, or once per micro-batch under sync_each_batch.
  if (auto f = acc.fsdp(*model)) {
    const int64_t per_window = int64_t(f->units().size()) * (sync_each_batch ? K : 1);
    expect(int64_t(f->comm_stats().buckets_reduced) == steps * per_window,
           "reductions per window: " + std::to_string(f->comm_stats().buckets_reduced) + " in " +
               std::to_string(steps) + " windows of " + std::to_string(f->units().size()) + " units");
  }
  const double diff = max_abs_diff(*model, *reference);
  const auto norms = acc.gather(from_vector<double>({last_norm})).to_vector<double>();
  std::printf("rank %d fsdp %s: max abs diff %.3g, optimizer holds %lld of %lld elements, last norm %.6g\n",
              acc.process_index(), strategy.c_str(), diff, (long long)shard_numel, (long long)model->num_parameters(),
              last_norm);
  expect(diff <= 1e-5, "sharded accumulated parameters match the large-batch run");
  expect(R == 1 || acc.fsdp(*model) != nullptr, "prepare installed the sharded wrapper");
  const bool shards_optimizer = R > 1 && fsdp.sharding_strategy != ShardingStrategy::NO_SHARD;
  expect(!shards_optimizer || shard_numel <= (model->num_parameters() + 3 * R) / R,
         "the optimizer steps this rank's shards only");
  expect(last_norm > 0 && std::all_of(norms.begin(), norms.end(), [&](double n) { return n == last_norm; }),
         "the clip norm is global: the same on every rank");
  expect(o->num_updates() == steps, "one update per accumulation window");

  // Save, take one more step, restore, take it again: the same weights bit for bit, so every
  // process got its own optimizer shards back.
  acc.save_state(dir);
  const auto saved = values_of(*model);
  data::DataLoader fixed(ds, {.batch_size = b});
  // Named copies: clang 14 cannot capture structured bindings in a lambda.
  auto prepared_model = m;
  auto prepared_opt = o;
  auto extra_step = [&] {
    auto batch = *fixed.begin();
    acc.backward(loss_of(*prepared_model, batch));
    expect(acc.sync_gradients(), "the extra step synchronises");
    prepared_opt->step();
    prepared_opt->zero_grad();
    return values_of(*model);
  };
  const auto first = extra_step();
  acc.load_state(dir);
  const bool restored = values_of(*model) == saved;
  const auto second = extra_step();
  const bool repeated = second == first && second != saved;
  expect(restored, "load_state restores the saved weights");
  expect(repeated, "the step after load_state repeats the step after save_state bit for bit");
  acc.wait_for_everyone();
  if (!failed) std::printf("fsdp ok\n");
  return failed ? 1 : 0;
}

// Counts what a scheduler does under accumulation in a loop with no model.
int64_t scheduler_steps(AcceleratorOptions opt, int64_t batches) {
  Accelerator acc(opt);
  auto p = from_vector<float>({1.0f}).requires_grad_();
  optim::SGD sgd({p}, {.lr = 0.1});
  optim::LRScheduler sched(sgd, [](int64_t) { return 1.0; });
  // One sample per process and micro-step: split_batches cuts a global batch of num_processes.
  const int64_t batch = opt.split_batches ? acc.num_processes() : 1;
  data::DataLoader loader(make_dataset(batches * acc.num_processes(), 3), {.batch_size = batch});
  auto [o, l, s] = acc.prepare(sgd, loader, sched);
  for ([[maybe_unused]] auto& batch : *l) {
    auto guard = acc.accumulate();
    o->step();
    s->step();
    o->zero_grad();
  }
  return s->last_step();
}

int run_accum(int64_t steps, int64_t b, bool overlap) {
  constexpr int K = 4;
  Accelerator acc({.gradient_accumulation_steps = K, .overlap_optimizer_step = overlap});
  const int R = acc.num_processes();
  auto ds = make_dataset(steps * K * R * b, 200);
  double ref_lr = 0;
  auto reference = train_reference(ds, K * R * b, steps, &ref_lr);

  auto model = make_mlp(1);
  optim::AdamW opt(model->parameters(), {.lr = 0.01});
  // One process at batch b would take steps*K*R micro-batches, steps*R updates.
  auto sched = optim::get_scheduler("linear", opt, kWarmup * R, 2 * steps * R);
  data::DataLoader loader(ds, {.batch_size = b, .shuffle = true, .seed = 5});
  auto [m, o, l, s] = acc.prepare(model, opt, loader, sched);
  if (overlap && R > 1) {
    expect(o->stepped_in_backward(), "overlap_optimizer_step: DDP steps the optimizer during backward");
    bool refused = false;
    try {
      acc.clip_grad_norm_(model->parameters(), 1.0);
    } catch (const Error& e) {
      refused = std::string(e.what()).find("overlap_optimizer_step") != std::string::npos;
    }
    expect(refused, "clip_grad_norm_ is refused under overlap_optimizer_step");
  }
  int64_t syncs = 0;
  for (auto& batch : *l) {
    auto guard = acc.accumulate(m);
    acc.backward(loss_of(*m, batch));
    syncs += acc.sync_gradients() ? 1 : 0;
    o->step();
    s->step();
    o->zero_grad();
  }
  const double diff = max_abs_diff(*model, *reference);
  std::printf("rank %d accum: max abs diff %.3g, updates %lld, scheduler steps %lld\n", acc.process_index(), diff,
              (long long)o->num_updates(), (long long)s->last_step());
  expect(diff <= 1e-5, "accumulated parameters match the large-batch run");
  expect(syncs == steps && o->num_updates() == steps, "one update per accumulation window");
  expect(s->last_step() == steps * R, "scheduler stepped num_processes times per update");
  expect(std::abs(s->get_last_lr()[0] - ref_lr) < 1e-12, "learning rate matches the large-batch schedule");

  // The stepping table of docs/accelerate_semantics.md: 6 micro-steps per process, K = 2.
  const int64_t with_opt = scheduler_steps({.gradient_accumulation_steps = 2}, 6);
  const int64_t split = scheduler_steps({.gradient_accumulation_steps = 2, .split_batches = true}, 6);
  const int64_t every_call = scheduler_steps({.gradient_accumulation_steps = 2, .step_scheduler_with_optimizer = false}, 6);
  std::printf("rank %d scheduler steps: with optimizer %lld, split_batches %lld, every call %lld\n", acc.process_index(),
              (long long)with_opt, (long long)split, (long long)every_call);
  expect(with_opt == 3 * R, "scheduler: updates * num_processes");
  expect(split == 3, "scheduler with split_batches: one per update");
  expect(every_call == 6, "scheduler without step_with_optimizer: one per call");
  acc.wait_for_everyone();
  if (!failed) std::printf(overlap ? "accum overlap ok\n" : "accum ok\n");
  return failed ? 1 : 0;
}

int run_metrics(int64_t n, int64_t b, bool split) {
  Accelerator acc({.split_batches = split});
  const int R = acc.num_processes(), rank = acc.process_index();
  data::DataLoader loader(make_dataset(n, 300), {.batch_size = b});
  auto l = acc.prepare(loader);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> seen;
    int64_t gathered_rows = 0;
    for (auto& batch : *l) {
      Tensor idx = acc.gather_for_metrics(batch["idx"]);
      gathered_rows += acc.gather(batch["idx"]).size(0);
      for (int64_t v : idx.to_vector<int64_t>()) seen.push_back(v);
    }
    std::vector<int64_t> want(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) want[size_t(i)] = i;
    expect(seen == want, "epoch " + std::to_string(epoch) + ": gather_for_metrics returns each sample once, in order (got " +
                             std::to_string(seen.size()) + " samples)");
    expect(gathered_rows >= n, "plain gather keeps the padding");
    expect(!acc.gradient_state().in_dataloader(), "no active loader after the loop");
  }
  // Different lengths per process gather in rank order.
  Tensor mine = full({rank + 1, 2}, double(rank), {.dtype = DType::f32});
  Tensor all = acc.gather(mine);
  expect(all.size(0) == R * (R + 1) / 2, "gather of different lengths");
  expect(all.to_vector<float>().back() == float(R - 1), "gather in rank order");
  Tensor padded = acc.pad_across_processes(mine, 0, -1.0);
  expect(padded.size(0) == R, "pad_across_processes pads to the longest");
  Tensor sum = acc.reduce(from_vector<float>({float(rank + 1)}, {1}), "sum");
  expect(sum.item<double>() == R * (R + 1) / 2.0, "reduce sum");
  Tensor mean = acc.reduce(from_vector<float>({float(rank + 1)}, {1}), "mean");
  expect(std::abs(mean.item<double>() - (R + 1) / 2.0) < 1e-6, "reduce mean");
  expect(acc.broadcast_object(rank == 0 ? std::string("from main") : std::string("x")) == "from main", "broadcast_object");
  auto names = acc.gather_object("r" + std::to_string(rank));
  expect(int(names.size()) == R && names.back() == "r" + std::to_string(R - 1), "gather_object");
  std::vector<int> items{0, 1, 2, 3, 4};
  auto share = acc.split_between_processes(items, /*apply_padding=*/true);
  auto all_shares = acc.gather_object(std::to_string(share.size()) + ":" + std::to_string(share.front()));
  expect(all_shares.front() == std::to_string((5 + R - 1) / R) + ":0", "split_between_processes");
  {
    auto first = acc.main_process_first();
  }
  acc.print("metrics printed once");
  if (!failed) std::printf("metrics ok\n");
  return failed ? 1 : 0;
}

// Something outside the model whose state must survive a restart.
struct SeenCounter {
  double seen = 0;
  std::map<std::string, double> state_dict() const { return {{"seen", seen}}; }
  void load_state_dict(const std::map<std::string, double>& s) { seen = s.at("seen"); }
};

int run_train(const std::string& project, const std::string& out, int64_t total, int64_t stop_at, bool resume) {
  Accelerator acc({.gradient_accumulation_steps = 2, .project_dir = project, .total_limit = 2});
  acc.set_seed(17, /*device_specific=*/true);
  auto model = make_mlp(9);
  optim::AdamW opt(model->parameters(), {.lr = 0.01});
  auto sched = optim::get_scheduler("cosine", opt, 2, total);
  data::DataLoader loader(make_dataset(40, 400), {.batch_size = 2, .shuffle = true, .seed = 3});
  auto [m, o, l, s] = acc.prepare(model, opt, loader, sched);
  SeenCounter counter;
  acc.register_for_checkpointing(counter);

  int64_t micro = 0;
  if (resume) {
    const std::string dir = acc.load_state();
    micro = l->epoch() * l->size() + l->position();
    std::printf("rank %d resumed from %s at micro-step %lld (epoch %lld, batch %lld), counter %g\n",
                acc.process_index(), dir.c_str(), (long long)micro, (long long)l->epoch(), (long long)l->position(),
                counter.seen);
    expect(counter.seen == double(micro), "registered object restored");
  }
  while (micro < total) {
    for (auto& batch : *l) {
      auto guard = acc.accumulate(m);
      // Random noise on the input: the generator state must be restored too.
      Tensor x = dropout(batch["x"], 0.2, true);
      acc.backward(nn::functional::mse_loss(m->forward(x), batch["y"]));
      acc.clip_grad_norm_(m->parameters(), 1.0);
      o->step();
      s->step();
      o->zero_grad();
      counter.seen += 1;
      ++micro;
      if (!resume && (micro % 4 == 0 || micro == stop_at) && micro <= stop_at) acc.save_state();
      if (!resume && micro == stop_at) {
        auto kept = list_checkpoints(checkpoints_root(project));
        std::printf("rank %d stopped at micro-step %lld with %zu checkpoints kept\n", acc.process_index(),
                    (long long)micro, kept.size());
        expect(kept.size() == 2, "total_limit keeps 2 checkpoints");
        if (!failed) std::printf("train ok\n");
        return failed ? 1 : 0;
      }
      if (micro == total) break;
    }
  }
  acc.save_model(*m, out);
  std::printf("rank %d finished: counter %g\n", acc.process_index(), counter.seen);
  if (!failed) std::printf("train ok\n");
  return failed ? 1 : 0;
}

std::vector<float> flat_values(const std::vector<Tensor>& tensors) {
  std::vector<float> out;
  for (const auto& t : tensors) {
    auto v = t.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

int run_amp() {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  Accelerator acc({.mixed_precision = "fp16", .scaler = {.init_scale = 1024.0}});
  const int R = acc.num_processes(), rank = acc.process_index();
  const bool overflows_here = rank == R - 1;

  // A scaler bound to the job's process group, used directly.
  {
    auto p = from_vector<float>({1.0f, 2.0f}).requires_grad_();
    optim::SGD sgd({p}, {.lr = 1.0});
    optim::GradScaler scaler({.init_scale = 8.0}, distributed::agree_on_overflow(acc.process_group()));
    p.set_grad(from_vector<float>({8.0f, overflows_here ? kInf : 8.0f}));
    const bool stepped = scaler.step(sgd);
    scaler.update();
    expect(!stepped, "GradScaler: the step is skipped on every rank");
    expect(p.to_vector<float>() == std::vector<float>{1.0f, 2.0f}, "GradScaler: a skipped step changes nothing");
    expect(scaler.get_scale() == 4.0, "GradScaler: every rank backs off");
    p.set_grad(from_vector<float>({4.0f, 4.0f}));
    expect(scaler.step(sgd), "GradScaler: a clean step is taken");
    scaler.update();
    expect(p.to_vector<float>() == std::vector<float>{0.0f, 1.0f}, "GradScaler: the clean step used 1/scale");
  }

  // The Accelerator: a DDP model plus one parameter outside it. DDP does not all-reduce that
  // parameter's gradient, so only the scaler's agreement tells the other ranks of its inf.
  auto model = make_mlp(31);
  Tensor extra = from_vector<float>({0.5f}).requires_grad_();
  std::vector<Tensor> params = model->parameters();
  params.push_back(extra);
  optim::SGD opt(params, {.lr = 0.1});
  optim::LRScheduler sched(opt, [](int64_t step) { return 1.0 / double(1 + step); });
  auto [m, o, s] = acc.prepare(model, opt, sched);
  auto [x, y] = batch_rows(0, 4 * R, 4 * rank, 4);
  int skipped = 0;
  for (int it = 0; it < 2; ++it) {
    const std::vector<float> before = flat_values(params);
    Tensor loss;
    {
      auto ac = acc.autocast();
      loss = nn::functional::mse_loss(m->forward(x), y) + sum(extra * extra);
    }
    acc.backward(loss);
    std::vector<Tensor> grads;
    for (const auto& p : params) grads.push_back(p.grad());
    if (it == 0 && overflows_here) extra.grad().fill_(kInf);
    const bool finite_here = all_finite(flat_values(grads));
    o->step();
    s->step();
    o->zero_grad();
    const bool was_skipped = acc.optimizer_step_was_skipped();
    if (it == 0) {
      expect(finite_here != overflows_here, "only the last rank holds an inf gradient");
      expect(was_skipped, "the step is skipped on every rank");
      expect(flat_values(params) == before, "a skipped step leaves the parameters");
      expect(s->last_step() == 0, "the scheduler does not advance on a skipped step");
      expect(acc.scaler()->get_scale() == 512.0, "every rank backs off the scale");
    } else {
      expect(finite_here, "the second iteration is clean");
      expect(!was_skipped, "the clean step is taken");
      expect(flat_values(params) != before, "the clean step moves the parameters");
      expect(s->last_step() == R, "the scheduler advances num_processes steps");
    }
    skipped += was_skipped ? 1 : 0;
  }
  // The replicas are still identical.
  const std::vector<float> mine = flat_values(params);
  Tensor all = acc.gather(from_vector<float>(mine, {1, int64_t(mine.size())}));
  bool identical = true;
  for (int r = 1; r < R; ++r) identical = identical && all.select(0, r).to_vector<float>() == all.select(0, 0).to_vector<float>();
  expect(identical, "parameters agree on every rank");
  std::printf("rank %d amp: skipped %d of 2 steps, scale %g\n", rank, skipped, acc.scaler()->get_scale());
  acc.wait_for_everyone();
  if (!failed) std::printf("amp ok\n");
  return failed ? 1 : 0;
}

// fp16 loss scaling over FULL_SHARD: only the last rank's shard gradient of one parameter is
// made inf, and every rank skips the step (found-inf agreed across ranks), then steps together.
int run_amp_sharded() {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  FSDPOptions fsdp;
  fsdp.sharding_strategy = ShardingStrategy::FULL_SHARD;
  fsdp.transformer_layer_cls_to_wrap = {"Linear"};
  fsdp.mixed_precision.param_dtype = DType::f16;  // the gathered compute copy in f16 too
  Accelerator acc({.mixed_precision = "fp16", .scaler = {.init_scale = 1024.0}, .fsdp = fsdp});
  const int R = acc.num_processes(), rank = acc.process_index();
  {
    // A param_dtype the forward's autocast would not match is refused before anything is sharded.
    Accelerator mismatched({.mixed_precision = "bf16", .fsdp = fsdp});
    auto other = make_mlp(32);
    optim::SGD sgd(other->parameters(), {.lr = 0.1});
    bool refused = false;
    try {
      mismatched.prepare(other, sgd);
    } catch (const Error& e) {
      refused = std::string(e.what()).find("param_dtype float16 needs mixed_precision 'fp16'") != std::string::npos;
      if (!refused) std::printf("unexpected error: %s\n", e.what());
    }
    expect(refused, "an fp16 param_dtype under bf16 autocast is refused");
  }
  auto model = make_mlp(31);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  auto [m, o] = acc.prepare(model, opt);
  auto sharded = acc.fsdp(*model);
  expect(sharded != nullptr, "prepare sharded the model");
  if (!sharded) return 1;
  expect(model->fc1->parameter("weight").dtype() == DType::f16, "the model computes on an f16 gathered copy");
  auto whole = [&] {
    std::vector<float> out;
    for (auto& [name, t] : sharded->full_state_dict())
      for (float v : t.to_vector<float>()) out.push_back(v);
    return out;
  };
  auto [x, y] = batch_rows(0, 4 * R, 4 * rank, 4);
  for (int it = 0; it < 2; ++it) {
    const std::vector<float> before = whole();
    {
      auto ac = acc.autocast();
      acc.backward(nn::functional::mse_loss(m->forward(x), y));
    }
    if (it == 0 && rank == R - 1)
      for (auto& p : o->param_groups()[0].params)
        if (p.numel() > 0 && p.grad().defined()) {
          p.grad().fill_(kInf);
          break;
        }
    o->step();
    o->zero_grad();
    const bool skipped = acc.optimizer_step_was_skipped();
    const std::vector<float> after = whole();
    if (it == 0) {
      expect(skipped, "the step is skipped on every rank");
      expect(after == before, "a skipped step leaves every shard");
      expect(acc.scaler()->get_scale() == 512.0, "every rank backs off the scale");
    } else {
      expect(!skipped && after != before, "the clean step is taken and moves the parameters");
    }
  }
  const std::vector<float> mine = whole();
  Tensor all = acc.gather(from_vector<float>(mine, {1, int64_t(mine.size())}));
  bool identical = true;
  for (int r = 1; r < R; ++r) identical = identical && all.select(0, r).to_vector<float>() == all.select(0, 0).to_vector<float>();
  expect(identical, "every rank gathers the same parameters");
  std::printf("rank %d amp under FULL_SHARD: scale %g\n", rank, acc.scaler()->get_scale());
  acc.wait_for_everyone();
  if (!failed) std::printf("amp sharded ok\n");
  return failed ? 1 : 0;
}

// The samples of one epoch of a prepared loader as all processes see them together, in order.
std::vector<int64_t> epoch_order(Accelerator& acc, AcceleratedDataLoader& l) {
  std::vector<int64_t> order;
  for (auto& batch : l)
    for (int64_t v : acc.gather_for_metrics(batch["idx"]).to_vector<int64_t>()) order.push_back(v);
  return order;
}

bool is_permutation_of_range(std::vector<int64_t> v, int64_t n) {
  std::sort(v.begin(), v.end());
  std::vector<int64_t> want(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) want[size_t(i)] = i;
  return v == want;
}

int run_structures(const std::string& dir) {
  Accelerator acc;
  const int R = acc.num_processes(), rank = acc.process_index();

  // gather_for_metrics on a tuple and on a Batch: every element loses the same duplicates.
  {
    data::DataLoader loader(make_dataset(11, 500), {.batch_size = 2});
    auto l = acc.prepare(loader);
    std::vector<int64_t> ids, doubled, batch_ids;
    for (auto& batch : *l) {
      auto [all_ids, all_doubled] = acc.gather_for_metrics(std::make_tuple(batch["idx"], batch["idx"] + batch["idx"]));
      for (int64_t v : all_ids.to_vector<int64_t>()) ids.push_back(v);
      for (int64_t v : all_doubled.to_vector<int64_t>()) doubled.push_back(v);
      Batch all = acc.gather_for_metrics(batch);
      for (int64_t v : all["idx"].to_vector<int64_t>()) batch_ids.push_back(v);
      expect(all["x"].size(0) == all["idx"].size(0) && all["x"].size(1) == kIn, "gather_for_metrics(Batch) keeps every field");
    }
    std::vector<int64_t> want(11);
    for (int64_t i = 0; i < 11; ++i) want[size_t(i)] = i;
    expect(ids == want && batch_ids == want, "gather_for_metrics on a tuple and a Batch: each sample once, in order");
    bool twice = doubled.size() == ids.size();
    for (size_t i = 0; twice && i < ids.size(); ++i) twice = doubled[i] == 2 * ids[i];
    expect(twice, "gather_for_metrics trims every element of the tuple alike");
  }

  // gather: a vector of tensors of different dtypes whose dim 0 differs between processes.
  {
    Tensor rows = full({rank + 1, 2}, double(rank), {.dtype = DType::f32});
    Tensor ids = full({rank + 2}, double(10 * rank), {.dtype = DType::i64});
    Tensor scalar = full({}, double(rank), {.dtype = DType::f32});
    Tensor flags = ge(ids, 10.0);  // bool: false on process 0, true elsewhere
    std::vector<Tensor> all = acc.gather(std::vector<Tensor>{rows, ids, scalar, flags});
    expect(all.size() == 4, "gather(vector) returns a vector of 4");
    expect(all[3].dtype() == DType::boolean && all[3].numel() == all[1].numel() &&
               all[3].to_vector<bool>().front() == false && all[3].to_vector<bool>().back() == (R > 1),
           "gather: bool tensors come back as bool");
    Tensor alone = acc.gather(flags);
    expect(alone.dtype() == DType::boolean && alone.numel() == all[1].numel(), "gather of one bool tensor");
    expect(all[0].size(0) == R * (R + 1) / 2 && all[0].size(1) == 2 && all[0].dtype() == DType::f32,
           "gather: rows of every process");
    expect(all[1].numel() == R * (R + 3) / 2 && all[1].dtype() == DType::i64, "gather: ids of every process");
    expect(all[2].numel() == R && all[2].to_vector<float>().back() == float(R - 1), "gather: 0-dim tensors as rows");
    expect(all[0].to_vector<float>().back() == float(R - 1) && all[1].to_vector<int64_t>().back() == 10 * (R - 1),
           "gather: rank order");
  }

  // reduce: one tuple of mixed dtypes, sum and mean.
  {
    auto [a, b, c] = acc.reduce(std::make_tuple(full({2}, double(rank + 1)), full({3, 1}, 2.0 * (rank + 1)),
                                                full({2}, double(rank + 1), {.dtype = DType::i64})),
                                "sum");
    const double want = R * (R + 1) / 2.0;
    expect(a.to_vector<float>() == std::vector<float>(2, float(want)) &&
               b.to_vector<float>() == std::vector<float>(3, float(2 * want)) && b.size(0) == 3 &&
               c.to_vector<int64_t>() == std::vector<int64_t>(2, int64_t(want)) && c.dtype() == DType::i64,
           "reduce(tuple, sum)");
    auto [m1, m2] = acc.reduce(std::make_pair(full({1}, double(rank + 1)), full({2}, double(rank))), "mean", 2.0);
    expect(std::abs(m1.item<double>() - (R + 1.0)) < 1e-6 && std::abs(m2.to_vector<float>()[1] - float(R - 1)) < 1e-6,
           "reduce(pair, mean, scale 2)");
  }

  // pad_across_processes pads along dim 1 only; dim 0 differs between processes and stays;
  // the 1-D field has no dim 1 and comes back as it is.
  {
    Batch b;
    b["tokens"] = full({rank + 1, rank + 2}, 1.0);
    b["label"] = full({rank + 1}, double(rank));
    Batch padded = acc.pad_across_processes(b, /*dim=*/1, /*pad_index=*/-1.0, /*pad_first=*/true);
    const Tensor t = padded["tokens"];
    expect(t.size(0) == rank + 1 && t.size(1) == R + 1, "pad_across_processes pads dim 1 to the longest, keeps dim 0");
    expect(t.select(0, 0).to_vector<float>().front() == (rank + 2 < R + 1 ? -1.0f : 1.0f), "pad_first puts the padding first");
    expect(padded["label"].numel() == rank + 1, "a tensor without dim 1 comes back as it is");
    Tensor alone = acc.pad_across_processes(full({2, rank + 1}, 3.0), 1);
    expect(alone.size(1) == R && alone.to_vector<float>().back() == (rank + 1 < R ? 0.0f : 3.0f),
           "pad_across_processes on one tensor pads dim 1 with 0");
  }

  // broadcast: a tuple from the last process.
  {
    auto [x, y] = acc.broadcast(std::make_tuple(full({2}, double(rank)), full({1}, double(rank), {.dtype = DType::i64})), R - 1);
    expect(x.to_vector<float>() == std::vector<float>(2, float(R - 1)) && y.to_vector<int64_t>()[0] == R - 1,
           "broadcast(tuple) from the last process");
  }

  // Processes passing different structures get an error naming the mismatch, not a hang.
  if (R > 1) {
    std::vector<Tensor> mine(size_t(rank + 1), full({1}, 1.0));
    try {
      (void)acc.gather(mine);
      expect(false, "gather of different structures raised nothing");
    } catch (const Error& e) {
      expect(std::string(e.what()).find("passes") != std::string::npos, std::string("a clear mismatch error, got: ") + e.what());
    }
  }

  // Loaders without a seed shuffle as set_seed says, with one order over all processes even
  // when every process seeds differently.
  {
    auto ds = make_dataset(12, 600);
    acc.set_seed(3, /*device_specific=*/true);
    data::DataLoader first(ds, {.batch_size = 2, .shuffle = true});
    auto l1 = acc.prepare(first);
    const auto order3 = epoch_order(acc, *l1);
    acc.set_seed(4, /*device_specific=*/true);
    data::DataLoader second(ds, {.batch_size = 2, .shuffle = true});
    auto l2 = acc.prepare(second);
    const auto order4 = epoch_order(acc, *l2);
    expect(is_permutation_of_range(order3, 12) && is_permutation_of_range(order4, 12),
           "a drawn seed is the same on every process: each sample once");
    expect(order3 != order4, "set_seed(3) and set_seed(4) give different orders");
    data::DataLoader fixed(ds, {.batch_size = 2, .shuffle = true, .seed = 9});
    auto l3 = acc.prepare(fixed);
    acc.set_seed(5);
    data::DataLoader fixed_again(ds, {.batch_size = 2, .shuffle = true, .seed = 9});
    auto l4 = acc.prepare(fixed_again);
    expect(epoch_order(acc, *l3) == epoch_order(acc, *l4), "an explicit seed wins over set_seed");
  }

  // save_pretrained through the Accelerator: written once, readable on every process after.
  {
    nn::BertConfig cfg = ember::testing::one_layer_bert_config(40);
    auto bert = acc.prepare(std::make_shared<nn::BertForSequenceClassification>(cfg));
    const std::string out = dir + "/bert";
    acc.unwrap_model(bert)->save_pretrained(out, {.is_main_process = acc.is_main_process(),
                                                  .save_function = acc.save_function()});
    expect(std::filesystem::exists(out + "/config.json") && std::filesystem::exists(out + "/model.safetensors"),
           "save_pretrained has written when it returns, on every process");
    auto loaded = nn::from_pretrained<nn::BertForSequenceClassification>(out);
    expect(max_abs_diff(*loaded, *bert) == 0.0, "save_pretrained wrote the prepared model's weights");
    const std::string own = dir + "/bert_of_process_" + std::to_string(rank);
    bert->save_pretrained(own, {.is_main_process = acc.is_main_process()});
    acc.wait_for_everyone();
    expect(std::filesystem::exists(own + "/config.json") == acc.is_main_process(),
           "without a save_function only the main process writes");
    acc.save_model(bert, dir + "/bert_model");
    expect(std::filesystem::exists(dir + "/bert_model/config.json"), "save_model takes the prepared handle");
  }

  // A prepared model's forward runs under the Accelerator's autocast, under DDP too.
  {
    Accelerator bf16({.mixed_precision = "bf16"});
    auto model = make_mlp(41);
    optim::SGD sgd(model->parameters(), {.lr = 0.1});
    auto [m, o] = bf16.prepare(model, sgd);
    auto [x, y] = batch_rows(0, 4 * R, 4 * rank, 4);
    Tensor out = m->forward(x);
    expect(out.dtype() == DType::bf16, "the prepared model's forward runs in bf16");
    expect(!autocast_enabled(DeviceType::CPU), "autocast ends with the call");
    bf16.backward(nn::functional::mse_loss(out, y));
    o->step();
    const std::vector<float> mine = flat_values(model->parameters());
    Tensor all = bf16.gather(from_vector<float>(mine, {1, int64_t(mine.size())}));
    bool identical = true;
    for (int r = 1; r < R; ++r) identical = identical && all.select(0, r).to_vector<float>() == all.select(0, 0).to_vector<float>();
    expect(identical && model->parameters()[0].dtype() == DType::f32, "DDP under autocast: f32 parameters agree");
  }

  acc.print("Process", rank, "of", R, "prints once");
  acc.wait_for_everyone();
  if (!failed) std::printf("structures ok\n");
  return failed ? 1 : 0;
}

int run_main_only_gather() {
  Accelerator acc;
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  try {
    Tensor mine = full({3, 2}, double(acc.process_index()), {.dtype = DType::f32});
    if (acc.is_main_process()) mine = acc.gather_for_metrics(mine);
    acc.wait_for_everyone();
  } catch (const Error& e) {
    error = e.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("rank %d failed after %.2f s: %s\n", acc.process_index(), seconds, error.c_str());
  expect(!error.empty(), "a collective called on the main process only fails");
  expect(seconds < 10.0, "the mismatch is reported within 10 s, not at the timeout");
  expect(error.find("rank 0 is in allgather") != std::string::npos && error.find("rank 1 in barrier") != std::string::npos,
         "the error names both ranks' collectives");
  if (!failed) std::printf("main only ok\n");
  return failed ? 1 : 0;
}

// A linear layer with a buffer, as a batch-norm layer keeps running statistics.
class LinearWithStat : public nn::Module {
 public:
  LinearWithStat() : Module("LinearWithStat"), lin(std::make_shared<nn::Linear>(kIn, kOut)) {
    add_child("lin", lin);
    register_buffer("stat", zeros({3}));
  }
  Tensor forward(const Tensor& x) override {
    auto scope = enter_forward();
    return scope.exit(lin->forward(x));
  }
  std::shared_ptr<nn::Linear> lin;
};

// The Accelerator applies DDP's broadcast_buffers: rank 0's buffers reach every rank before a
// training forward, and only then (not under no_grad, in eval mode or inside no_sync).
int run_buffers(bool broadcast) {
  AcceleratorOptions options;
  options.ddp.broadcast_buffers = broadcast;
  Accelerator acc(options);
  const int rank = acc.process_index();
  auto model = std::make_shared<LinearWithStat>();
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  auto [m, o] = acc.prepare(model, opt);
  Tensor stat = model->named_buffers()[0].second;
  auto set_mine = [&] { stat.fill_(double(rank + 1)); };
  auto stat_is = [&](double v) { return stat.to_vector<float>()[0] == float(v); };
  Tensor x = uniform_tensor(3, {4, kIn});

  set_mine();
  if (rank == 1) {  // one rank evaluating alone must not start a collective
    NoGradGuard no_grad;
    m->forward(x);
  }
  acc.wait_for_everyone();
  expect(stat_is(rank + 1), "a no_grad forward leaves the buffers alone");
  m->eval();
  m->forward(x);
  expect(stat_is(rank + 1), "an eval-mode forward leaves the buffers alone");
  m->train();
  {
    auto local = acc.no_sync(m);
    m->forward(x).sum().backward();
  }
  expect(stat_is(rank + 1), "a forward inside no_sync leaves the buffers alone");
  acc.backward(m->forward(x).sum());
  o->step();
  expect(stat_is(broadcast ? 1 : rank + 1), broadcast ? "a training forward copies rank 0's buffers"
                                                     : "broadcast_buffers off keeps each rank's buffers");
  std::printf("rank %d buffers: stat %.1f after the training forward\n", rank, stat.to_vector<float>()[0]);
  acc.wait_for_everyone();
  if (!failed) std::printf("buffers ok\n");
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  auto arg = [&](int i) -> int64_t { return i < argc ? std::atoll(argv[i]) : 0; };
  try {
    if (mode == "ddp" && argc == 4) return run_ddp(arg(2), arg(3));
    if (mode == "accum" && argc == 4) return run_accum(arg(2), arg(3), false);
    if (mode == "accum" && argc == 5 && std::string(argv[4]) == "overlap") return run_accum(arg(2), arg(3), true);
    if (mode == "metrics" && argc == 5) return run_metrics(arg(2), arg(3), arg(4) != 0);
    if (mode == "train" && argc == 7) return run_train(argv[2], argv[3], arg(4), arg(5), arg(6) != 0);
    if (mode == "amp" && argc == 2) return run_amp();
    if (mode == "amp_sharded" && argc == 2) return run_amp_sharded();
    if (mode == "fsdp" && (argc == 6 || (argc == 7 && std::string(argv[6]) == "sync_each_batch")))
      return run_fsdp(argv[2], arg(3), arg(4), argv[5], argc == 7);
    if (mode == "structures" && argc == 3) return run_structures(argv[2]);
    if (mode == "main_only_gather" && argc == 2) return run_main_only_gather();
    if (mode == "buffers" && argc == 3) return run_buffers(std::string(argv[2]) == "on");
    std::fprintf(stderr, "usage: accel_worker ddp|accum <steps> <batch> | metrics <n> <batch> <split> | "
                         "train <project> <out> <total> <stop_at> <resume> | amp | structures <dir>\n");
    return 2;
  } catch (const std::exception& e) {
    std::printf("failed: %s\n", e.what());
    return 1;
  }
}
