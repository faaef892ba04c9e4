// The Accelerator in one process (no launcher, no environment): prepare, the accumulation and
// scheduler semantics, token-level losses, gather_for_metrics, clipping, save_state/load_state
// (resume, rotation, atomicity, hooks, mismatch errors) and save_model. Multi-process behaviour
// is in test_accelerator_processes.cpp.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ddp_test_model.h"
#include "ember/accelerate.h"
#include "test_util.h"

using namespace ember;
using namespace ember::distributed;
using namespace ember::ddp_test;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<data::TensorDataset> make_dataset(int64_t n, uint64_t seed = 100) {
  return std::make_shared<data::TensorDataset>(std::map<std::string, Tensor>{
      {"x", uniform_tensor(seed, {n, kIn})}, {"y", uniform_tensor(seed + 1, {n, kOut})}, {"idx", arange(n)}});
}

Tensor loss_of(nn::Module& model, Batch& batch) { return nn::functional::mse_loss(model.forward(batch["x"]), batch["y"]); }

std::vector<float> flat(const nn::Module& m) {
  std::vector<float> out;
  for (auto& p : m.parameters()) {
    auto v = p.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

std::vector<float> flat_grads(const nn::Module& m) {
  std::vector<float> out;
  for (auto& p : m.parameters()) {
    auto v = p.grad().to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EMBER_CHECK(a.size() == b.size(), "max_diff: sizes differ");
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
  return worst;
}

// Sets environment variables for the lifetime of the object.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (auto [k, v] : vars) {
      names_.push_back(k);
      setenv(k, v, 1);
    }
  }
  ~ScopedEnv() {
    for (auto* k : names_) unsetenv(k);
  }

 private:
  std::vector<const char*> names_;
};

// These tests compare against CPU references: the process stays on the CPU even where a GPU
// exists (later Accelerators without `cpu` share this state).
const bool kProcessOnCpu = [] {
  AcceleratorState::initialize(/*cpu=*/true, std::chrono::seconds(30));
  return true;
}();

}  // namespace

TEST(Accelerator, OneProcessWithoutEnvironment) {
  Accelerator acc;
  EXPECT_EQ(acc.process_index(), 0);
  EXPECT_EQ(acc.local_process_index(), 0);
  EXPECT_EQ(acc.num_processes(), 1);
  EXPECT_TRUE(acc.is_main_process());
  EXPECT_TRUE(acc.is_local_main_process());
  EXPECT_EQ(acc.distributed_type(), "NO");
  EXPECT_TRUE(kProcessOnCpu);
  EXPECT_EQ(acc.device(), Device::cpu());
  EXPECT_EQ(acc.process_group(), nullptr);
  EXPECT_EQ(acc.mixed_precision(), "no");
  EXPECT_EQ(acc.gradient_accumulation_steps(), 1);
  EXPECT_TRUE(acc.sync_gradients());
  EXPECT_FALSE(acc.optimizer_step_was_skipped());
  acc.wait_for_everyone();
  { auto first = acc.main_process_first(); }
  auto mp = acc.autocast();
  EXPECT_EQ(mp.dtype(), "no");
  // A second Accelerator shares the process state.
  Accelerator other({.cpu = true});
  EXPECT_EQ(&other.state(), &acc.state());
}

TEST(Accelerator, LauncherEnvironmentFillsUnsetOptions) {
  {
    ScopedEnv env({{"EMBER_MIXED_PRECISION", "no"}, {"EMBER_GRADIENT_ACCUMULATION_STEPS", "3"}, {"EMBER_USE_CPU", "1"}});
    Accelerator acc;
    EXPECT_EQ(acc.mixed_precision(), "no");
    EXPECT_EQ(acc.gradient_accumulation_steps(), 3);
    EXPECT_TRUE(acc.options().cpu);
    // What the program sets wins.
    Accelerator set({.gradient_accumulation_steps = 2});
    EXPECT_EQ(set.gradient_accumulation_steps(), 2);
  }
  {
    // Half precision needs autocast and a loss scaler, which this version does not have: a
    // launcher asking for it gets a clear refusal rather than a silent f32 run.
    ScopedEnv env({{"EMBER_MIXED_PRECISION", "bf16"}});
    EXPECT_EMBER_ERROR(Accelerator(), "mixed_precision", "'bf16'", "not available");
  }
  {
    ScopedEnv env({{"EMBER_GRADIENT_ACCUMULATION_STEPS", "zero"}});
    EXPECT_EMBER_ERROR(Accelerator(), "EMBER_GRADIENT_ACCUMULATION_STEPS='zero'");
  }
  EXPECT_EMBER_ERROR(Accelerator({.mixed_precision = "fp8"}), "mixed_precision", "'fp8'");
  EXPECT_EMBER_ERROR(Accelerator({.mixed_precision = "fp16"}), "mixed_precision", "'fp16'", "not available");
  EXPECT_EMBER_ERROR(Accelerator({.gradient_accumulation_steps = 0}), "gradient_accumulation_steps", "0");
  EXPECT_EMBER_ERROR(Accelerator({.total_limit = 0}), "total_limit");
}

TEST(Accelerator, PrepareReturnsObjectsInOrder) {
  Accelerator acc;
  auto model = make_mlp(1);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  data::DataLoader loader(make_dataset(10), {.batch_size = 4});
  auto sched = optim::get_scheduler("constant", opt, 0, 10);
  auto [s, l, m, o] = acc.prepare(sched, loader, model, opt);
  static_assert(std::is_same_v<decltype(m), std::shared_ptr<Mlp>>);
  static_assert(std::is_same_v<decltype(o), std::shared_ptr<AcceleratedOptimizer>>);
  static_assert(std::is_same_v<decltype(l), std::shared_ptr<AcceleratedDataLoader>>);
  static_assert(std::is_same_v<decltype(s), std::shared_ptr<AcceleratedScheduler>>);
  EXPECT_EQ(m, model);
  EXPECT_EQ(acc.unwrap_model(m), model);
  EXPECT_EQ(&o->optimizer(), &opt);
  EXPECT_EQ(&s->scheduler(), sched.get());
  EXPECT_EQ(l->size(), 3);
  EXPECT_EQ(acc.ddp(*model), nullptr);  // one process: no DDP
  // One object comes back as itself; owned schedulers and shared optimizers work too.
  auto model2 = make_mlp(2);
  auto opt2 = std::make_shared<optim::AdamW>(model2->parameters(), optim::AdamWOptions{});
  std::shared_ptr<AcceleratedOptimizer> o2 = acc.prepare(opt2);
  std::shared_ptr<AcceleratedScheduler> s2 = acc.prepare(optim::get_scheduler("linear", *opt2, 1, 5));
  EXPECT_EQ(s2->last_step(), 0);
  EXPECT_EQ(acc.optimizers().size(), 2u);
  EXPECT_EQ(acc.schedulers().size(), 2u);
  EXPECT_EQ(acc.models().size(), 1u);
  EXPECT_EQ(acc.prepare(model), model);
  EXPECT_EQ(acc.models().size(), 1u);  // preparing again changes nothing
}

TEST(Accelerator, AccumulationSyncsEveryKthStepAndAtTheEndOfTheEpoch) {
  Accelerator acc({.gradient_accumulation_steps = 3});
  auto p = from_vector<float>({1.0f}).requires_grad_();
  optim::SGD sgd({p}, {.lr = 0.1});
  optim::LRScheduler sched(sgd, [](int64_t s) { return 1.0 / double(1 + s); });
  data::DataLoader loader(make_dataset(7), {.batch_size = 1});
  auto [o, l, s] = acc.prepare(sgd, loader, sched);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<int> syncs, ends;
    for ([[maybe_unused]] auto& batch : *l) {
      auto guard = acc.accumulate();
      syncs.push_back(acc.sync_gradients());
      ends.push_back(acc.gradient_state().end_of_dataloader());
      acc.backward(sum(p * 3.0));  // d/dp = 3 / K per micro-step
      o->step();
      s->step();
      o->zero_grad();
    }
    EXPECT_EQ(syncs, (std::vector<int>{0, 0, 1, 0, 0, 1, 1})) << "epoch " << epoch;
    EXPECT_EQ(ends, (std::vector<int>{0, 0, 0, 0, 0, 0, 1}));
    EXPECT_FALSE(acc.gradient_state().end_of_dataloader());
  }
  EXPECT_EQ(o->num_updates(), 6);
  EXPECT_EQ(s->last_step(), 6);
  EXPECT_EQ(s->num_calls(), 14);
  EXPECT_EQ(l->epoch(), 2);  // a completed pass moves to the next epoch
}

TEST(Accelerator, BackwardDividesByTheAccumulationSteps) {
  Accelerator acc({.gradient_accumulation_steps = 4});
  auto p = from_vector<float>({2.0f}).requires_grad_();
  acc.backward(sum(p * p));
  EXPECT_FLOAT_EQ(p.grad().item<float>(), 1.0f);  // 2p / 4
  EXPECT_EMBER_ERROR(acc.backward(Tensor()), "backward", "undefined");
}

TEST(Accelerator, FourMicroBatchesEqualOneFourTimesLargerBatch) {
  auto ds = make_dataset(48);
  auto reference = make_mlp(3);
  {
    optim::SGD opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
    data::DataLoader loader(ds, {.batch_size = 16, .shuffle = true, .seed = 2});
    for (auto& b : loader) {
      loss_of(*reference, b).backward();
      opt.step();
      opt.zero_grad();
    }
  }
  Accelerator acc({.gradient_accumulation_steps = 4});
  auto model = make_mlp(3);
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  data::DataLoader loader(ds, {.batch_size = 4, .shuffle = true, .seed = 2});
  auto [m, o, l] = acc.prepare(model, opt, loader);
  for (auto& b : *l) {
    auto guard = acc.accumulate(m);
    acc.backward(loss_of(*m, b));
    o->step();
    o->zero_grad();
  }
  EXPECT_EQ(o->num_updates(), 3);
  EXPECT_LE(max_abs_diff(*model, *reference), 1e-6);
  EXPECT_GT(max_abs_diff(*reference, *make_mlp(3)), 1e-3);
}

TEST(Accelerator, TokenSumLossUnderAccumulationEqualsTheBigBatchTokenMean) {
  // Micro-batches with different numbers of real tokens: averaging per micro-batch would weigh
  // tokens unequally; backward_token_sum with the window's token count does not.
  auto model = make_mlp(4);
  auto x = uniform_tensor(1, {12, kIn}), y = uniform_tensor(2, {12, kOut});
  std::vector<float> mask_values = {1, 1, 1, 1, 1, 0, 1, 0, 0, 1, 1, 0};
  Tensor mask = from_vector<float>(mask_values, {12, 1});
  auto masked_sum = [&](nn::Module& m, int64_t first, int64_t n) {
    Tensor err = nn::functional::mse_loss(m.forward(x.narrow(0, first, n)), y.narrow(0, first, n), Reduction::None);
    return sum(err * mask.narrow(0, first, n));
  };
  // Big batch: the token mean over 12 rows (8 real rows x 3 outputs).
  const double real = 8 * kOut;
  (masked_sum(*model, 0, 12) * (1.0 / real)).backward();
  auto want = flat_grads(*model);
  model->zero_grad();

  Accelerator acc({.gradient_accumulation_steps = 3});
  std::vector<Tensor> window_masks;
  for (int k = 0; k < 3; ++k) window_masks.push_back(mask.narrow(0, 4 * k, 4).expand({4, kOut}));
  const int64_t tokens = acc.global_token_count(window_masks);
  EXPECT_EQ(tokens, int64_t(real));
  EXPECT_EQ(acc.global_token_count(int64_t(5)), 5);
  for (int k = 0; k < 3; ++k) acc.backward_token_sum(masked_sum(*model, 4 * k, 4), tokens);
  EXPECT_LE(max_diff(flat_grads(*model), want), 1e-6);
  EXPECT_EMBER_ERROR(acc.backward_token_sum(masked_sum(*model, 0, 4), 0), "global_tokens", "> 0");
}

TEST(Accelerator, SchedulerWithoutOptimizerSteppingStepsEveryCall) {
  Accelerator acc({.gradient_accumulation_steps = 2, .step_scheduler_with_optimizer = false});
  auto p = from_vector<float>({1.0f}).requires_grad_();
  optim::SGD sgd({p}, {.lr = 0.1});
  auto sched = optim::get_scheduler("linear", sgd, 0, 100);
  data::DataLoader loader(make_dataset(6), {.batch_size = 1});
  auto [o, l, s] = acc.prepare(sgd, loader, sched);
  for ([[maybe_unused]] auto& b : *l) {
    auto guard = acc.accumulate();
    o->step();
    s->step();
  }
  EXPECT_EQ(s->last_step(), 6);
  EXPECT_EQ(o->num_updates(), 3);
}

TEST(Accelerator, GatherForMetricsInOneProcessKeepsEverything) {
  Accelerator acc;
  data::DataLoader loader(make_dataset(11), {.batch_size = 4});
  auto l = acc.prepare(loader);
  std::vector<int64_t> seen;
  for (auto& b : *l)
    for (int64_t v : acc.gather_for_metrics(b["idx"]).to_vector<int64_t>()) seen.push_back(v);
  ASSERT_EQ(seen.size(), 11u);
  for (int64_t i = 0; i < 11; ++i) EXPECT_EQ(seen[size_t(i)], i);
  EXPECT_EQ(acc.gather(from_vector<float>({3.0f})).shape(), (Shape{1}));
  EXPECT_EQ(acc.gather(full({}, 2.0)).shape(), (Shape{1}));  // a scalar counts as one row
  EXPECT_EQ(acc.reduce(from_vector<float>({3.0f}), "mean").item<float>(), 3.0f);
  EXPECT_EQ(acc.reduce(from_vector<float>({3.0f}), "sum", 2.0).item<float>(), 6.0f);
  EXPECT_EMBER_ERROR(acc.reduce(from_vector<float>({3.0f}), "max"), "reduce", "'max'");
  EXPECT_EMBER_ERROR(acc.reduce(from_vector<int64_t>({3}), "mean"), "reduce", "floating");
  EXPECT_EQ(acc.pad_across_processes(full({2, 3}, 1.0), 1).shape(), (Shape{2, 3}));
  EXPECT_EMBER_ERROR(acc.pad_across_processes(full({2, 3}, 1.0), 2), "pad_across_processes", "dim 2");
  EXPECT_EQ(acc.broadcast_object("hello"), "hello");
  EXPECT_EQ(acc.split_between_processes(std::vector<int>{1, 2, 3}), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(acc.split_between_processes(int64_t(7)), (std::pair<int64_t, int64_t>{0, 7}));
}

TEST(Accelerator, ClippingWaitsForTheSynchronisingStep) {
  Accelerator acc({.gradient_accumulation_steps = 2});
  auto p = from_vector<float>({3.0f, 4.0f}).requires_grad_();
  data::DataLoader loader(make_dataset(4), {.batch_size = 1});
  auto l = acc.prepare(loader);
  auto it = l->begin();
  {
    auto guard = acc.accumulate();
    ASSERT_FALSE(acc.sync_gradients());
    sum(p * p).backward();  // grad (6, 8), norm 10
    EXPECT_NEAR(acc.clip_grad_norm_({p}, 1.0), 10.0, 1e-5);
    acc.clip_grad_value_({p}, 0.5);
    EXPECT_EQ(p.grad().to_vector<float>(), (std::vector<float>{6.0f, 8.0f}));  // untouched
  }
  ++it;
  {
    auto guard = acc.accumulate();
    ASSERT_TRUE(acc.sync_gradients());
    EXPECT_NEAR(acc.clip_grad_norm_({p}, 1.0), 10.0, 1e-5);
    EXPECT_NEAR(p.grad().to_vector<float>()[1], 0.8f, 1e-5);
  }
}

// ---- checkpoints

namespace {

struct Counter {
  double value = 0;
  std::map<std::string, double> state_dict() const { return {{"value", value}}; }
  void load_state_dict(const std::map<std::string, double>& s) { value = s.at("value"); }
};

// A training setup whose every piece of state matters: AdamW moments, the schedule, dropout
// noise from the generator, a shuffled loader and a registered counter.
struct TrainingRun {
  explicit TrainingRun(AcceleratorOptions opt, uint64_t model_seed = 5)
      : acc(std::move(opt)), model(make_mlp(model_seed)),
        opt(model->parameters(), {.lr = 0.02}),
        loader(make_dataset(20), {.batch_size = 3, .shuffle = true, .seed = 8}) {
    sched = optim::get_scheduler("cosine", this->opt, 2, 30);
    std::tie(m, o, l, s) = acc.prepare(model, this->opt, loader, sched);
    acc.register_for_checkpointing(counter);
  }
  // Runs `n` more micro-steps, crossing epochs as needed.
  void steps(int n) {
    while (n > 0) {
      for (auto& b : *l) {
        auto guard = acc.accumulate(m);
        Tensor x = dropout(b["x"], 0.3, true);
        acc.backward(nn::functional::mse_loss(m->forward(x), b["y"]));
        o->step();
        s->step();
        o->zero_grad();
        counter.value += 1;
        if (--n == 0) return;
      }
    }
  }
  Accelerator acc;
  std::shared_ptr<Mlp> model;
  optim::AdamW opt;
  data::DataLoader loader;
  std::unique_ptr<optim::LRScheduler> sched;
  std::shared_ptr<Mlp> m;
  std::shared_ptr<AcceleratedOptimizer> o;
  std::shared_ptr<AcceleratedDataLoader> l;
  std::shared_ptr<AcceleratedScheduler> s;
  Counter counter;
};

}  // namespace

TEST(AcceleratorCheckpoint, ResumeMidEpochContinuesExactly) {
  ember::testing::TempDir dir("accel_resume");
  manual_seed(3);
  std::vector<float> want;
  double want_counter = 0;
  int64_t want_sched = 0;
  {
    TrainingRun straight({.gradient_accumulation_steps = 2});
    straight.steps(16);  // 7 batches per epoch: ends mid-epoch 2
    want = flat(*straight.model);
    want_counter = straight.counter.value;
    want_sched = straight.s->last_step();
  }
  manual_seed(3);
  std::string saved;
  {
    TrainingRun first({.gradient_accumulation_steps = 2, .project_dir = dir.path()});
    first.steps(9);  // epoch 1, batch 2 of 7: the end of an accumulation window
    saved = first.acc.save_state();
    EXPECT_EQ(saved, dir.path() + "/checkpoints/checkpoint_0");
    first.steps(3);  // keeps going: this must not leak into the resumed run
  }
  manual_seed(999);  // the resumed process starts from another generator state
  TrainingRun resumed({.gradient_accumulation_steps = 2, .project_dir = dir.path()});
  EXPECT_EQ(resumed.acc.load_state(), saved);
  EXPECT_EQ(resumed.l->epoch(), 1);
  EXPECT_EQ(resumed.l->position(), 2);
  EXPECT_EQ(resumed.counter.value, 9);
  EXPECT_EQ(resumed.acc.save_iteration(), 1);
  resumed.steps(7);
  EXPECT_EQ(resumed.counter.value, want_counter);
  EXPECT_EQ(resumed.s->last_step(), want_sched);
  EXPECT_LE(max_diff(flat(*resumed.model), want), 1e-7);
  EXPECT_GT(max_diff(want, flat(*make_mlp(5))), 1e-3);
}

TEST(AcceleratorCheckpoint, RotationKeepsTotalLimitAndNeverReusesANumber) {
  ember::testing::TempDir dir("accel_rotate");
  {
    TrainingRun run({.project_dir = dir.path(), .total_limit = 2});
    for (int i = 0; i < 4; ++i) {
      run.steps(1);
      run.acc.save_state();
    }
    EXPECT_EQ(run.acc.save_iteration(), 4);
    auto kept = list_checkpoints(checkpoints_root(dir.path()));
    ASSERT_EQ(kept.size(), 2u);
    EXPECT_EQ(kept[0].first, 2);
    EXPECT_EQ(kept[1].first, 3);
  }
  // A new run in the same project would number its checkpoints below the existing ones: refused.
  TrainingRun again({.project_dir = dir.path(), .total_limit = 2});
  EXPECT_EMBER_ERROR(again.acc.save_state(), "save_state", "checkpoint_3", "set_save_iteration");
  again.acc.load_state();  // latest
  EXPECT_EQ(again.counter.value, 4);
  EXPECT_EQ(again.acc.save_iteration(), 4);
  again.acc.save_state();
  EXPECT_EQ(list_checkpoints(checkpoints_root(dir.path())).back().first, 4);
  EXPECT_EQ(list_checkpoints(checkpoints_root(dir.path())).size(), 2u);
  EXPECT_EMBER_ERROR(TrainingRun(AcceleratorOptions{}).acc.save_state(), "save_state", "project_dir");
  EXPECT_EMBER_ERROR(TrainingRun({.project_dir = dir.file("empty")}).acc.load_state(), "load_state", "no checkpoint");
}

TEST(AcceleratorCheckpoint, AFailedSaveLeavesTheLastGoodCheckpoint) {
  ember::testing::TempDir dir("accel_atomic");
  const std::string ckpt = dir.file("ckpt");
  TrainingRun run(AcceleratorOptions{});
  run.steps(2);
  run.acc.save_state(ckpt);
  const auto good = flat(*run.model);
  run.steps(2);
  // A hook that breaks the weights makes the write fail halfway.
  auto handle = run.acc.register_save_state_pre_hook(
      [](std::vector<std::shared_ptr<nn::Module>>&, std::vector<nn::StateDict>& weights, const std::string&) {
        weights[0]["broken"] = Tensor();
      });
  EXPECT_THROW(run.acc.save_state(ckpt), Error);
  run.acc.load_state(ckpt);
  EXPECT_EQ(flat(*run.model), good);
  handle.remove();
  run.acc.save_state(ckpt);  // works again, replacing the old one
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename().string());
  EXPECT_EQ(std::count(names.begin(), names.end(), "ckpt"), 1);
}

TEST(AcceleratorCheckpoint, HooksCanTakeOverModels) {
  ember::testing::TempDir dir("accel_hooks");
  TrainingRun run(AcceleratorOptions{});
  run.steps(2);
  int saves = 0, loads = 0;
  run.acc.register_save_state_pre_hook(
      [&](std::vector<std::shared_ptr<nn::Module>>& models, std::vector<nn::StateDict>& weights, const std::string& d) {
        EXPECT_EQ(models.size(), 1u);
        EXPECT_EQ(d, dir.file("c"));
        weights.clear();  // the hook saves the model its own way
        ++saves;
      });
  run.acc.register_load_state_pre_hook([&](std::vector<std::shared_ptr<nn::Module>>& models, const std::string&) {
    models.clear();
    ++loads;
  });
  run.acc.save_state(dir.file("c"));
  EXPECT_FALSE(fs::exists(dir.file("c/model.safetensors")));
  EXPECT_TRUE(fs::exists(dir.file("c/optimizer.safetensors")));
  run.acc.load_state(dir.file("c"));
  EXPECT_EQ(saves, 1);
  EXPECT_EQ(loads, 1);
}

TEST(AcceleratorCheckpoint, LoadingAnotherModelOrWorldSizeIsAClearError) {
  ember::testing::TempDir dir("accel_mismatch");
  const std::string ckpt = dir.file("ckpt");
  {
    TrainingRun run(AcceleratorOptions{});
    run.steps(1);
    run.acc.save_state(ckpt);
  }
  {
    // A wider hidden layer: same keys, other shapes.
    Accelerator acc;
    auto wide = std::make_shared<Mlp>(kIn, kHidden + 1, kOut);
    optim::AdamW opt(wide->parameters(), {});
    data::DataLoader loader(make_dataset(20), {.batch_size = 3});
    auto sched = optim::get_scheduler("cosine", opt, 2, 30);
    Counter c;
    auto prepared = acc.prepare(wide, opt, loader, sched);
    acc.register_for_checkpointing(c);
    EXPECT_EMBER_ERROR(acc.load_state(ckpt), "load_state", "model.safetensors", "does not match",
                       "fc1.weight is [16, 6] in the checkpoint but [17, 6] in the model");
  }
  {
    // An extra layer: missing keys.
    Accelerator acc;
    auto extra = std::make_shared<Mlp>(kIn, kHidden, kOut, /*with_extra=*/true);
    optim::AdamW opt(extra->parameters(), {});
    data::DataLoader loader(make_dataset(20), {.batch_size = 3});
    auto sched = optim::get_scheduler("cosine", opt, 2, 30);
    Counter c;
    auto prepared = acc.prepare(extra, opt, loader, sched);
    acc.register_for_checkpointing(c);
    EXPECT_EMBER_ERROR(acc.load_state(ckpt), "model.safetensors", "missing keys", "'extra.bias'");
  }
  {
    // Fewer prepared objects than saved.
    Accelerator acc;
    auto model = make_mlp(5);
    acc.prepare(model);
    EXPECT_EMBER_ERROR(acc.load_state(ckpt), "load_state", "holds 1 optimizers but 0 were prepared");
  }
  // Saved by two processes.
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(ckpt + "/accelerator_state.json"));
  meta["num_processes"] = 2;
  std::ofstream(ckpt + "/accelerator_state.json") << meta.dump();
  fs::copy_file(ckpt + "/random_states_0.json", ckpt + "/random_states_1.json");
  TrainingRun run(AcceleratorOptions{});
  EXPECT_EMBER_ERROR(run.acc.load_state(ckpt), "load_state", "saved by 2 processes", "this job has 1 process");
  EXPECT_EMBER_ERROR(run.acc.load_state(dir.file("nowhere")), "load_state", "nowhere", "does not exist");
}

TEST(AcceleratorCheckpoint, SaveModelWritesSafetensorsOrTheHuggingFaceFormat) {
  ember::testing::TempDir dir("accel_save_model");
  Accelerator acc;
  auto model = make_mlp(6);
  acc.save_model(*model, dir.file("mlp"));
  auto saved = nn::load_safetensors(dir.file("mlp/model.safetensors"));
  EXPECT_EQ(saved.size(), model->state_dict().size());
  EXPECT_TRUE(ember::testing::all_close(saved.at("fc1.weight"), model->fc1->weight, 0, 0));

  nn::BertConfig cfg = nn::BertConfig::tiny(64);
  cfg.num_hidden_layers = 1;
  cfg.hidden_size = 16;
  cfg.num_attention_heads = 2;
  cfg.intermediate_size = 32;
  cfg.max_position_embeddings = 16;
  auto bert = std::make_shared<nn::BertForSequenceClassification>(cfg);
  acc.save_model(*bert, dir.file("bert"));
  EXPECT_TRUE(fs::exists(dir.file("bert/config.json")));
  auto loaded = nn::from_pretrained<nn::BertForSequenceClassification>(dir.file("bert"));
  EXPECT_TRUE(ember::testing::all_close(loaded->classifier->weight, bert->classifier->weight, 0, 0));

  acc.save(model->state_dict(), dir.file("weights.safetensors"));
  EXPECT_EQ(nn::load_safetensors(dir.file("weights.safetensors")).size(), saved.size());
}

TEST(AcceleratorCheckpoint, RegisteredModulesAndOptimizersRoundTrip) {
  ember::testing::TempDir dir("accel_registered");
  Accelerator acc;
  auto ema = make_mlp(7);  // e.g. an averaged copy of the model, not prepared
  optim::SGD ema_opt(ema->parameters(), {.lr = 0.1, .momentum = 0.9});
  sum(ema->forward(uniform_tensor(3, {2, kIn}))).backward();
  ema_opt.step();  // creates momentum buffers
  acc.register_for_checkpointing(ema, ema_opt);
  const auto params = flat(*ema);
  std::map<std::string, Tensor> momentum;  // copies: state_dict() hands out the live buffers
  for (const auto& [k, t] : ema_opt.state_dict().tensors) momentum[k] = t.clone();
  acc.save_state(dir.file("c"));
  {
    NoGradGuard ng;
    for (auto& p : ema->parameters()) p.fill_(0.0);
  }
  ema_opt.step();  // moves the momentum
  acc.load_state(dir.file("c"));
  EXPECT_EQ(flat(*ema), params);
  for (const auto& [k, t] : ema_opt.state_dict().tensors) EXPECT_TRUE(ember::testing::all_close(t, momentum.at(k), 0, 0)) << k;
  EXPECT_TRUE(fs::exists(dir.file("c/custom_checkpoint_1.safetensors")));
}
