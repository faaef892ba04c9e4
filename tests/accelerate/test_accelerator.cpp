// The Accelerator in one process (no launcher, no environment): prepare, the accumulation and
// scheduler semantics, token-level losses, gather_for_metrics, clipping, save_state/load_state
// (resume, rotation, atomicity, hooks, mismatch errors), save_model, and mixed precision
// (autocast, fp16 loss scaling, skipped steps, the scaler in checkpoints). Multi-process
// behaviour is in test_accelerator_processes.cpp.
#include <algorithm>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ddp_test_model.h"
#include "fsdp_options_expect.h"
#include "ember/accelerate.h"
#include "small_bert.h"
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

std::vector<float> flat(const nn::Module& m) { return flat_parameters(m); }

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
  EXPECT_EQ(acc.scaler(), nullptr);
  {
    auto ac = acc.autocast();  // "no": autocast stays off
    EXPECT_FALSE(autocast_enabled(DeviceType::CPU));
  }
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
    ScopedEnv env({{"EMBER_MIXED_PRECISION", "bf16"}});
    Accelerator acc;
    EXPECT_EQ(acc.mixed_precision(), "bf16");
    EXPECT_EQ(acc.scaler(), nullptr);  // bf16 has f32's range: no loss scaling
  }
  {
    ScopedEnv env({{"EMBER_MIXED_PRECISION", "fp16"}});
    Accelerator acc;
    EXPECT_EQ(acc.mixed_precision(), "fp16");
    ASSERT_NE(acc.scaler(), nullptr);
    EXPECT_EQ(acc.scaler()->get_scale(), 65536.0);
  }
  {
    ScopedEnv env({{"EMBER_MIXED_PRECISION", "fp8"}});
    EXPECT_EMBER_ERROR(Accelerator(), "mixed_precision", "'fp8'");
  }
  {
    ScopedEnv env({{"EMBER_GRADIENT_ACCUMULATION_STEPS", "zero"}});
    EXPECT_EMBER_ERROR(Accelerator(), "EMBER_GRADIENT_ACCUMULATION_STEPS='zero'");
  }
  EXPECT_EMBER_ERROR(Accelerator({.mixed_precision = "fp8"}), "mixed_precision", "'fp8'");
  EXPECT_EMBER_ERROR(Accelerator({.mixed_precision = "FP16"}), "mixed_precision", "'FP16'");
  EXPECT_EMBER_ERROR(Accelerator({.mixed_precision = "fp16", .scaler = {.growth_factor = 0.5}}), "GradScaler",
                     "growth_factor");
  EXPECT_EMBER_ERROR(Accelerator({.gradient_accumulation_steps = 0}), "gradient_accumulation_steps", "0");
  EXPECT_EMBER_ERROR(Accelerator({.total_limit = 0}), "total_limit");
}

TEST(Accelerator, LauncherEnvironmentFillsUnsetFsdp) {
  EXPECT_FALSE(Accelerator().options().fsdp.has_value());
  {
    // What `ember launch --use_fsdp --fsdp_sharding_strategy SHARD_GRAD_OP ...` hands a rank.
    ScopedEnv env({{"EMBER_USE_FSDP", "true"},
                   {"EMBER_FSDP_SHARDING_STRATEGY", "SHARD_GRAD_OP"},
                   {"EMBER_FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP"},
                   {"EMBER_FSDP_TRANSFORMER_CLS_TO_WRAP", "BertLayer"},
                   {"EMBER_FSDP_BACKWARD_PREFETCH", "NO_PREFETCH"},
                   {"EMBER_FSDP_ACTIVATION_CHECKPOINTING", "true"},
                   {"EMBER_FSDP_REDUCE_DTYPE", "bf16"}});
    const FSDPOptions expected{.sharding_strategy = ShardingStrategy::SHARD_GRAD_OP,
                               .transformer_layer_cls_to_wrap = {"BertLayer"},
                               .backward_prefetch = BackwardPrefetch::NO_PREFETCH,
                               .mixed_precision = {.reduce_dtype = DType::bf16},
                               .activation_checkpointing = true};
    Accelerator acc;
    ASSERT_TRUE(acc.options().fsdp.has_value());
    ember::testing::expect_same_fsdp_options(*acc.options().fsdp, expected);

    // Options the program set win, whole.
    Accelerator set({.fsdp = FSDPOptions{.sharding_strategy = ShardingStrategy::NO_SHARD}});
    EXPECT_EQ(set.options().fsdp->sharding_strategy, ShardingStrategy::NO_SHARD);
    EXPECT_FALSE(set.options().fsdp->activation_checkpointing);
  }
  {
    ScopedEnv env({{"EMBER_USE_FSDP", "false"}, {"EMBER_FSDP_SHARDING_STRATEGY", "SHARD_GRAD_OP"}});
    EXPECT_FALSE(Accelerator().options().fsdp.has_value());
  }
  {
    ScopedEnv env({{"EMBER_USE_FSDP", "1"}, {"EMBER_FSDP_SHARDING_STRATEGY", "2"}});
    EXPECT_EMBER_ERROR(Accelerator(), "EMBER_FSDP_SHARDING_STRATEGY='2'", "give the name");
  }
}

TEST(Accelerator, PrepareReturnsObjectsInOrder) {
  Accelerator acc;
  auto model = make_mlp(1);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  data::DataLoader loader(make_dataset(10), {.batch_size = 4});
  auto sched = optim::get_scheduler("constant", opt, 0, 10);
  auto [s, l, m, o] = acc.prepare(sched, loader, model, opt);
  static_assert(std::is_same_v<decltype(m), PreparedModel<Mlp>>);  // the shared_ptr, whose -> autocasts
  static_assert(std::is_base_of_v<std::shared_ptr<Mlp>, decltype(m)>);
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

TEST(Accelerator, CollectivesTakeNestedStructuresAndReturnTheSame) {
  Accelerator acc;
  const Tensor a = from_vector<float>({1, 2, 3, 4}, {2, 2});
  const Tensor ids = from_vector<int64_t>({7, 8}, {2});
  auto [ga, gids] = acc.gather(std::make_tuple(a, ids));
  EXPECT_TRUE(ember::testing::all_close(ga, a, 0, 0));
  EXPECT_EQ(gids.to_vector<int64_t>(), (std::vector<int64_t>{7, 8}));
  EXPECT_NE(ga.impl(), a.impl()) << "a copy, as the one-tensor gather returns";
  // std::tie comes back as values; a 0-dim tensor in a structure counts as one row, as alone.
  Tensor scalar = full({}, 5.0);
  auto [tied_a, tied_scalar] = acc.gather(std::tie(a, scalar));
  EXPECT_EQ(tied_scalar.shape(), (Shape{1}));
  EXPECT_EQ(tied_a.shape(), a.shape());

  Batch batch;
  batch["x"] = a;
  batch["labels"] = ids;
  Batch gathered = acc.gather_for_metrics(batch);
  EXPECT_EQ(gathered.fields.size(), 2u);
  EXPECT_EQ(gathered["labels"].to_vector<int64_t>(), (std::vector<int64_t>{7, 8}));
  std::vector<Tensor> reduced = acc.reduce(std::vector<Tensor>{a, a * 2.0}, "sum", 0.5);
  ASSERT_EQ(reduced.size(), 2u);
  EXPECT_EQ(reduced[1].to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
  auto [first, rest] = acc.broadcast(std::make_pair(a, std::vector<Tensor>{ids, a}));
  EXPECT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0].to_vector<int64_t>(), (std::vector<int64_t>{7, 8}));
  // Nested: a map of tuples.
  std::map<std::string, std::tuple<Tensor, Batch>> nested{{"eval", {ids, batch}}};
  auto padded = acc.pad_across_processes(nested, 1);
  EXPECT_EQ(std::get<1>(padded.at("eval"))["x"].shape(), (Shape{2, 2}));
  EXPECT_EQ(std::get<0>(padded.at("eval")).shape(), (Shape{2}));  // no dim 1: as it is

  // Errors name the tensor of the structure.
  Batch broken;
  broken["x"] = a;
  broken["mask"] = Tensor();
  EXPECT_EMBER_ERROR(acc.gather(broken), "gather", "['mask']", "undefined");
  EXPECT_EMBER_ERROR(acc.reduce(std::make_tuple(a, ids), "mean"), "reduce", "[1]", "int64");
  EXPECT_EMBER_ERROR(acc.broadcast(std::make_tuple(a), 1), "broadcast", "process 1");
  static_assert(!TensorStructure<std::vector<int>>, "only tensors are leaves");
  static_assert(TensorStructure<std::tuple<Tensor, std::vector<Batch>>>);
}

TEST(Accelerator, PrintSeparatesItsArgumentsWithSpacesAsPythonDoes) {
  Accelerator acc;
  std::ostringstream captured;
  std::streambuf* previous = std::cout.rdbuf(captured.rdbuf());
  acc.print("Process", acc.process_index(), "of", acc.num_processes());
  acc.print("alone");
  acc.print();
  std::cout.rdbuf(previous);
  EXPECT_EQ(captured.str(), "Process 0 of 1\nalone\n\n");
}

TEST(AcceleratorCheckpoint, SaveModelTakesTheHandleASharedPtrOrTheModule) {
  ember::testing::TempDir dir("accel_save_model_forms");
  Accelerator acc;
  auto model = make_mlp(6);
  auto m = acc.prepare(model);
  std::shared_ptr<nn::Module> base = model;
  acc.save_model(m, dir.file("handle"));                    // what prepare returned
  acc.save_model(model, dir.file("shared_ptr"));            // the shared_ptr
  acc.save_model(base, dir.file("base"));                   // a shared_ptr to the base class
  acc.save_model(*m, dir.file("module"));                   // the module
  acc.save_model(acc.unwrap_model(m), dir.file("unwrapped"));
  for (const char* form : {"handle", "shared_ptr", "base", "module", "unwrapped"}) {
    auto saved = nn::load_safetensors(dir.file(std::string(form) + "/model.safetensors"));
    EXPECT_TRUE(ember::testing::all_close(saved.at("fc2.weight"), model->fc2->weight, 0, 0)) << form;
  }
  EXPECT_EMBER_ERROR(acc.save_model(std::shared_ptr<Mlp>(), dir.file("null")), "save_model", "null");
}

TEST(AcceleratorCheckpoint, SavePretrainedWritesOnlyOnTheMainProcessOrThroughTheSaveFunction) {
  ember::testing::TempDir dir("accel_save_pretrained");
  nn::BertConfig cfg = ember::testing::one_layer_bert_config(64);
  Accelerator acc({.mixed_precision = "bf16"});
  auto bert = acc.prepare(std::make_shared<nn::BertForMaskedLM>(cfg));
  acc.unwrap_model(bert)->save_pretrained(dir.file("main"), {.is_main_process = acc.is_main_process(),
                                                             .save_function = acc.save_function()});
  auto loaded = nn::from_pretrained<nn::BertForMaskedLM>(dir.file("main"));
  EXPECT_TRUE(ember::testing::all_close(loaded->transform_dense->weight, bert->transform_dense->weight, 0, 0));
  EXPECT_EQ(nn::BertConfig::from_json_file(dir.file("main/config.json")).architectures,
            (std::vector<std::string>{"BertForMaskedLM"}));
  // Tied weights once, as transformers writes them.
  EXPECT_FALSE(nn::load_safetensors(dir.file("main/model.safetensors")).count("cls.predictions.decoder.weight"));

  // Another process: nothing written, no directory made.
  bert->save_pretrained(dir.file("other"), {.is_main_process = false});
  EXPECT_FALSE(fs::exists(dir.file("other")));
  // A save_function is called on every process (a collective one needs them all); only the
  // main process writes the config.
  int calls = 0;
  std::string path;
  auto counting = [&](const nn::StateDict& weights, const std::string& p) {
    ++calls;
    path = p;
    EXPECT_FALSE(weights.empty());
  };
  bert->save_pretrained(dir.file("counted"), {.is_main_process = false, .save_function = counting});
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(fs::exists(dir.file("counted/config.json")));
  bert->save_pretrained(dir.file("counted"), {.save_function = counting});
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(path, dir.file("counted") + "/model.safetensors");
  EXPECT_TRUE(fs::exists(dir.file("counted/config.json")));
  EXPECT_FALSE(fs::exists(dir.file("counted/model.safetensors")));  // the function chose not to write
  // A classifier and the encoder alone have it too.
  auto classifier = std::make_shared<nn::BertForSequenceClassification>(cfg);
  classifier->save_pretrained(dir.file("classifier"));
  EXPECT_EQ(nn::BertConfig::from_json_file(dir.file("classifier/config.json")).architectures,
            (std::vector<std::string>{"BertForSequenceClassification"}));
  classifier->bert->save_pretrained(dir.file("encoder"));
  EXPECT_TRUE(fs::exists(dir.file("encoder/model.safetensors")));
}

namespace {

// The sample order of one pass of a prepared loader.
std::vector<int64_t> pass_order(AcceleratedDataLoader& l) {
  std::vector<int64_t> order;
  for (auto& b : l)
    for (int64_t v : b["idx"].to_vector<int64_t>()) order.push_back(v);
  return order;
}

}  // namespace

TEST(AcceleratorSeed, SetSeedDecidesTheShuffleOfLoadersBuiltWithoutASeed) {
  Accelerator acc;
  auto ds = make_dataset(24);
  auto order_after = [&](uint64_t seed, std::optional<uint64_t> loader_seed) {
    acc.set_seed(seed);
    data::DataLoader loader(ds, {.batch_size = 4, .shuffle = true, .seed = loader_seed});
    EXPECT_EQ(loader.sampler().seed_was_drawn(), !loader_seed.has_value());
    auto l = acc.prepare(loader);
    return pass_order(*l);
  };
  const auto one = order_after(1, std::nullopt), two = order_after(2, std::nullopt);
  EXPECT_NE(one, two);
  EXPECT_EQ(order_after(1, std::nullopt), one);
  EXPECT_EQ(order_after(1, 7), order_after(2, 7));  // an explicit seed wins
  std::vector<int64_t> sorted = one;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, pass_order(*acc.prepare(data::DataLoader(ds, {.batch_size = 4}))));
}

TEST(AcceleratorCheckpoint, ResumeRestoresADrawnShuffleSeed) {
  ember::testing::TempDir dir("accel_resume_seed");
  auto ds = make_dataset(20);
  std::vector<int64_t> rest;
  {
    Accelerator acc;
    acc.set_seed(1);
    data::DataLoader loader(ds, {.batch_size = 4, .shuffle = true});
    auto l = acc.prepare(loader);
    int64_t seen = 0;
    for (auto& b : *l) {
      if (++seen == 2) acc.save_state(dir.file("c"));  // two batches of epoch 0 handed out
      if (seen > 2)
        for (int64_t v : b["idx"].to_vector<int64_t>()) rest.push_back(v);  // batches 3 to 5
    }
    EXPECT_EQ(rest.size(), 12u);
  }
  const auto meta = nlohmann::json::parse(std::ifstream(dir.file("c/accelerator_state.json")));
  EXPECT_TRUE(meta.at("dataloaders").at(0).contains("seed")) << meta.dump();
  // The resumed program seeds differently, so its loader draws another seed; load_state puts
  // the saved one back and the pass continues the saved order.
  Accelerator acc;
  acc.set_seed(2);
  data::DataLoader loader(ds, {.batch_size = 4, .shuffle = true});
  auto l = acc.prepare(loader);
  acc.load_state(dir.file("c"));
  EXPECT_EQ(pass_order(*l), rest);
  // An explicit seed is not a drawn one: nothing is saved for it.
  Accelerator fixed;
  data::DataLoader explicit_seed(ds, {.batch_size = 4, .shuffle = true, .seed = 3});
  auto lf = fixed.prepare(explicit_seed);
  EXPECT_FALSE(lf->state().seed.has_value());
}

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
  // A fresh start (nothing saved yet): load_state() does nothing, so one program serves the first
  // start and every restart.
  TrainingRun fresh({.project_dir = dir.file("empty")});
  const auto before = flat(*fresh.model);
  EXPECT_EQ(fresh.acc.load_state(), "");
  EXPECT_EQ(flat(*fresh.model), before);
  EXPECT_EQ(fresh.acc.save_iteration(), 0);
  EXPECT_EMBER_ERROR(TrainingRun(AcceleratorOptions{}).acc.load_state(), "load_state", "project_dir");
}

TEST(AcceleratorCheckpoint, MaybeSaveStateFollowsTheStepPolicyAndNeverSavesInsideAWindow) {
  ember::testing::TempDir dir("accel_policy");
  std::vector<int> saved_at;  // micro-steps after which a checkpoint was written
  {
    TrainingRun run({.gradient_accumulation_steps = 2, .project_dir = dir.path(), .checkpoint_every_n_steps = 3});
    for (int micro = 1; micro <= 13; ++micro) {
      run.steps(1);
      if (auto d = run.acc.maybe_save_state()) {
        saved_at.push_back(micro);
        EXPECT_EQ(*d, dir.path() + "/checkpoints/checkpoint_" + std::to_string(saved_at.size() - 1));
      }
    }
    EXPECT_EQ(run.acc.backward_passes(), 13);
  }
  // Optimizer steps end at even micro-steps; every third one saves.
  EXPECT_EQ(saved_at, (std::vector<int>{6, 12}));
  // The restarted program: load_state() picks the latest and the count goes on from it.
  TrainingRun resumed({.gradient_accumulation_steps = 2, .project_dir = dir.path(), .checkpoint_every_n_steps = 3});
  EXPECT_EQ(resumed.acc.load_state(), dir.path() + "/checkpoints/checkpoint_1");
  EXPECT_EQ(resumed.acc.backward_passes(), 12);
  EXPECT_EQ(resumed.counter.value, 12);
  int next = 0;
  for (int micro = 13; micro <= 18 && next == 0; ++micro) {
    resumed.steps(1);
    if (resumed.acc.maybe_save_state()) next = micro;
  }
  EXPECT_EQ(next, 18);  // three optimizer steps after the load, not after the original start
  // A time policy: with a tiny interval every optimizer step saves, and never a window's middle.
  ember::testing::TempDir timed_dir("accel_policy_time");
  TrainingRun timed({.gradient_accumulation_steps = 2, .project_dir = timed_dir.path(), .checkpoint_every_seconds = 1e-9});
  std::vector<bool> saves;
  for (int micro = 1; micro <= 4; ++micro) {
    timed.steps(1);
    saves.push_back(timed.acc.maybe_save_state().has_value());
  }
  EXPECT_EQ(saves, (std::vector<bool>{false, true, false, true}));
  // No policy: never saves.
  TrainingRun plain({.project_dir = timed_dir.file("plain")});
  plain.steps(1);
  EXPECT_FALSE(plain.acc.maybe_save_state().has_value());
  EXPECT_EMBER_ERROR(Accelerator({.checkpoint_every_n_steps = 2}), "checkpoint_every_n_steps", "project_dir");
  EXPECT_EMBER_ERROR(Accelerator({.project_dir = dir.path(), .checkpoint_every_n_steps = -1}), "checkpoint_every_n_steps");
  EXPECT_EMBER_ERROR(Accelerator({.project_dir = dir.path(), .checkpoint_every_seconds = -1}), "checkpoint_every_seconds");
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

TEST(AcceleratorCheckpoint, LoadingAnotherModelOrAnIncompleteCheckpointIsAClearError) {
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
  // Said to be saved by two processes, with one process's generator file: incomplete.
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(ckpt + "/accelerator_state.json"));
  meta["num_processes"] = 2;
  std::ofstream(ckpt + "/accelerator_state.json") << meta.dump();
  TrainingRun run(AcceleratorOptions{});
  EXPECT_EMBER_ERROR(run.acc.load_state(ckpt), "load_state", "holds 1 random_states_<rank>.json files",
                     "saved by 2 processes");
  // With both it is a checkpoint of two processes, and one process resumes from it (another
  // world size loads; tests/accelerate/test_sharded_checkpoint_processes.cpp covers sharding).
  fs::copy_file(ckpt + "/random_states_0.json", ckpt + "/random_states_1.json");
  run.acc.load_state(ckpt);
  const auto saved = nn::load_safetensors(ckpt + "/model.safetensors");
  EXPECT_TRUE(ember::testing::all_close(saved.at("fc1.weight"), run.model->fc1->weight, 0, 0));
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

  nn::BertConfig cfg = ember::testing::one_layer_bert_config(64);
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

// ---- mixed precision

TEST(AcceleratorMixedPrecision, Bf16AutocastRunsLinearInBf16AndKeepsF32Parameters) {
  Accelerator acc({.mixed_precision = "bf16"});
  auto model = acc.prepare(make_mlp(21));
  EXPECT_TRUE(model->converts_outputs_to_f32());  // convert_outputs_to_fp32
  EXPECT_FALSE(Accelerator().prepare(make_mlp(21))->converts_outputs_to_f32());
  const Tensor x = uniform_tensor(22, {5, kIn}), y = uniform_tensor(23, {5, kOut});
  Tensor loss;
  {
    auto ac = acc.autocast();
    EXPECT_TRUE(autocast_enabled(DeviceType::CPU));
    EXPECT_EQ(autocast_dtype(DeviceType::CPU), DType::bf16);
    EXPECT_EQ(model->fc1->forward(x).dtype(), DType::bf16);
    Tensor out = model->forward(x);
    EXPECT_EQ(out.dtype(), DType::bf16);
    loss = nn::functional::mse_loss(out, y);
    EXPECT_EQ(loss.dtype(), DType::f32);
  }
  EXPECT_FALSE(autocast_enabled(DeviceType::CPU));
  Mlp& raw = *model;  // past the prepared handle: no autocast of its own
  EXPECT_EQ(raw.fc1->forward(x).dtype(), DType::f32);  // outside the scope: f32 again
  acc.backward(loss);
  for (const auto& [name, p] : model->named_parameters()) {
    EXPECT_EQ(p.dtype(), DType::f32) << name;
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().dtype(), DType::f32) << name;
  }
  // The bf16 gradients are those of the f32 model within bf16 precision.
  auto reference = make_mlp(21);
  nn::functional::mse_loss(reference->forward(x), y).backward();
  EXPECT_LE(max_diff(flat_grads(*model), flat_grads(*reference)), 0.05);
  EXPECT_GT(max_diff(flat_grads(*model), std::vector<float>(flat_grads(*model).size(), 0.0f)), 1e-3);

  Accelerator fp16({.mixed_precision = "fp16"});
  {
    auto ac = fp16.autocast();
    EXPECT_EQ(raw.fc1->forward(x).dtype(), DType::f16);
    // A nested "no" scope changes nothing: the enclosing fp16 scope stays in force.
    Accelerator off;
    {
      auto none = off.autocast();
      EXPECT_EQ(raw.fc1->forward(x).dtype(), DType::f16);
    }
    EXPECT_EQ(raw.fc1->forward(x).dtype(), DType::f16);
  }
}

TEST(AcceleratorMixedPrecision, APreparedModelsCallsRunUnderAutocastAsAccelerateWrapsForward) {
  const Tensor x = uniform_tensor(24, {5, kIn}), y = uniform_tensor(25, {5, kOut});
  Accelerator acc({.mixed_precision = "bf16"});
  auto model = make_mlp(21);
  auto m = acc.prepare(model);
  static_assert(std::is_convertible_v<decltype(m), std::shared_ptr<Mlp>>, "the handle is the model's shared_ptr");
  EXPECT_EQ(m, model);
  EXPECT_EQ(m.get(), model.get());

  // No acc.autocast() scope: the call through the handle autocasts, and only the call.
  Tensor out = m->forward(x);
  EXPECT_EQ(out.dtype(), DType::bf16);
  EXPECT_FALSE(autocast_enabled(DeviceType::CPU));
  EXPECT_EQ(m->fc1->forward(x).dtype(), DType::bf16);
  EXPECT_EQ((*m).forward(x).dtype(), DType::f32);     // past the handle
  EXPECT_EQ(model->forward(x).dtype(), DType::f32);   // the original shared_ptr
  std::shared_ptr<Mlp> copy = m;
  EXPECT_EQ(copy->forward(x).dtype(), DType::f32);    // a plain copy
  // unwrap_model keeps the wrapper by default (keep_fp32_wrapper=True), also from the original.
  EXPECT_EQ(acc.unwrap_model(m)->forward(x).dtype(), DType::bf16);
  EXPECT_EQ(acc.unwrap_model(model)->forward(x).dtype(), DType::bf16);
  EXPECT_EQ(acc.unwrap_model(m, /*keep_fp32_wrapper=*/false)->forward(x).dtype(), DType::f32);
  EXPECT_EQ(acc.unwrap_model(make_mlp(1))->forward(x).dtype(), DType::f32);  // never prepared

  // The gradients reach the f32 parameters and are those of the f32 model within bf16 precision.
  acc.backward(nn::functional::mse_loss(out, y));
  auto reference = make_mlp(21);
  nn::functional::mse_loss(reference->forward(x), y).backward();
  for (const auto& p : model->parameters()) EXPECT_EQ(p.grad().dtype(), DType::f32);
  EXPECT_LE(max_diff(flat_grads(*model), flat_grads(*reference)), 0.05);

  // fp16 autocasts in f16; "no" and autocast_prepared_model = false leave the call alone.
  Accelerator fp16({.mixed_precision = "fp16"});
  EXPECT_EQ(fp16.prepare(make_mlp(3))->forward(x).dtype(), DType::f16);
  Accelerator none;
  EXPECT_EQ(none.prepare(make_mlp(3))->forward(x).dtype(), DType::f32);
  Accelerator manual({.mixed_precision = "bf16", .autocast_prepared_model = false});
  auto plain = manual.prepare(make_mlp(3));
  EXPECT_EQ(plain->forward(x).dtype(), DType::f32);
  {
    auto ac = manual.autocast();  // code outside the model still autocasts in the scope
    EXPECT_EQ(plain->forward(x).dtype(), DType::bf16);
  }

  // The handle works wherever a shared_ptr did: accumulate, no_sync, save_model, DDP lookup.
  {
    auto guard = acc.accumulate(m);
    auto local = acc.no_sync(m);
  }
  EXPECT_EQ(acc.ddp(*m), nullptr);
}

TEST(AcceleratorMixedPrecision, BackwardScalesTheAveragedLoss) {
  Accelerator acc({.mixed_precision = "fp16", .gradient_accumulation_steps = 4});
  auto p = from_vector<float>({2.0f}).requires_grad_();
  acc.backward(sum(p * p));
  EXPECT_EQ(p.grad().item<float>(), 65536.0f);  // 2p / 4 * 2^16
  p.set_grad(Tensor());
  acc.backward_token_sum(sum(p * p), 4);
  EXPECT_EQ(p.grad().item<float>(), 65536.0f);  // 2p / 4 tokens * 2^16
}

namespace {

// y = x W^T + b for one row x with entries of magnitude <= 1, summed: d loss / d out is 1, so
// under f16 autocast the scaled gradients are at most the scale itself, which overflows f16
// (max 65504) at 2^16 and fits at 2^15.
struct OverflowOnce {
  explicit OverflowOnce(AcceleratorOptions opt)
      : acc(std::move(opt)), model(std::make_shared<nn::Linear>(3, 1)), sgd(model->parameters(), {.lr = 0.5}),
        sched(sgd, [](int64_t step) { return 1.0 / double(1 + step); }) {
    NoGradGuard ng;
    model->weight.copy_(from_vector<float>({0.5f, -0.25f, 1.0f}, {1, 3}));
    model->bias.fill_(0.0);
    std::tie(m, o, s) = acc.prepare(model, sgd, sched);
  }
  void iteration() {
    Tensor loss;
    {
      auto ac = acc.autocast();
      loss = sum(m->forward(x));
    }
    acc.backward(loss);
    o->step();
    s->step();
    o->zero_grad();
  }
  Accelerator acc;
  std::shared_ptr<nn::Linear> model;
  optim::SGD sgd;
  optim::LRScheduler sched;
  std::shared_ptr<nn::Linear> m;
  std::shared_ptr<AcceleratedOptimizer> o;
  std::shared_ptr<AcceleratedScheduler> s;
  Tensor x = from_vector<float>({1, 0.5f, -1}, {1, 3});
};

}  // namespace

TEST(AcceleratorMixedPrecision, AnOverflowSkipsTheStepAndHoldsTheScheduler) {
  OverflowOnce run({.mixed_precision = "fp16"});
  const auto before = flat(*run.model);
  run.iteration();
  EXPECT_TRUE(run.acc.optimizer_step_was_skipped());
  EXPECT_TRUE(run.o->step_was_skipped());
  EXPECT_EQ(run.o->num_updates(), 0);
  EXPECT_EQ(flat(*run.model), before);
  EXPECT_EQ(run.s->last_step(), 0);
  EXPECT_EQ(run.s->get_last_lr()[0], 0.5);
  EXPECT_EQ(run.acc.scaler()->get_scale(), 32768.0);

  run.iteration();  // 2^15 fits: a real step, with the true (unscaled) gradient
  EXPECT_FALSE(run.acc.optimizer_step_was_skipped());
  EXPECT_EQ(run.o->num_updates(), 1);
  EXPECT_EQ(run.s->last_step(), 1);
  EXPECT_EQ(run.s->get_last_lr()[0], 0.25);
  // dW = x, db = 1; lr 0.5.
  const std::vector<float> want = {0.0f, -0.5f, 1.5f, -0.5f};
  EXPECT_EQ(flat(*run.model), want);
  EXPECT_EQ(run.acc.scaler()->get_scale(), 32768.0);
  EXPECT_EQ(run.acc.scaler()->growth_tracker(), 1);

  // bf16 has no scaler and never skips.
  OverflowOnce bf16({.mixed_precision = "bf16"});
  bf16.iteration();
  EXPECT_FALSE(bf16.acc.optimizer_step_was_skipped());
  EXPECT_EQ(bf16.s->last_step(), 1);
}

TEST(AcceleratorMixedPrecision, SkippedStepsUnderAccumulationHoldTheSchedulerUntilACleanWindow) {
  // Each micro-step backpropagates scale / 2: 2^16 at first (overflow), 2^15 after one backoff.
  OverflowOnce run({.mixed_precision = "fp16", .gradient_accumulation_steps = 2, .scaler = {.init_scale = 131072.0}});
  data::DataLoader loader(make_dataset(8), {.batch_size = 1});
  auto l = run.acc.prepare(loader);
  std::vector<int> skipped, sched_steps;
  for ([[maybe_unused]] auto& batch : *l) {
    auto guard = run.acc.accumulate();
    run.iteration();
    skipped.push_back(run.acc.optimizer_step_was_skipped());
    sched_steps.push_back(int(run.s->last_step()));
  }
  // The first window overflows: its synchronising step is skipped (and reported until the next
  // synchronising step, as in Accelerate), and the scheduler waits for the next clean window.
  EXPECT_EQ(skipped, (std::vector<int>{0, 1, 1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(sched_steps, (std::vector<int>{0, 0, 0, 1, 1, 2, 2, 3}));
  EXPECT_EQ(run.o->num_updates(), 3);
  EXPECT_EQ(run.acc.scaler()->get_scale(), 65536.0);
}

TEST(AcceleratorMixedPrecision, ClippingUnscalesFirstAndReturnsTheTrueNorm) {
  Accelerator acc({.mixed_precision = "fp16", .gradient_accumulation_steps = 2});
  auto p = from_vector<float>({3.0f, 4.0f}).requires_grad_();
  optim::SGD sgd({p}, {.lr = 0.5});
  data::DataLoader loader(make_dataset(4), {.batch_size = 1});
  auto [o, l] = acc.prepare(sgd, loader);
  auto it = l->begin();
  {
    auto guard = acc.accumulate();
    ASSERT_FALSE(acc.sync_gradients());
    acc.backward(sum(p * p));  // true grad (6, 8) / 2 = (3, 4), norm 5
    EXPECT_NEAR(acc.clip_grad_norm_({p}, 1.0), 5.0, 1e-5);
    EXPECT_EQ(p.grad().to_vector<float>(), (std::vector<float>{3.0f * 65536, 4.0f * 65536}));  // still scaled
    o->step();
  }
  ++it;
  {
    auto guard = acc.accumulate();
    ASSERT_TRUE(acc.sync_gradients());
    acc.backward(sum(p * p));  // window total (6, 8), norm 10
    EXPECT_NEAR(acc.clip_grad_norm_({p}, 1.0), 10.0, 1e-5);
    EXPECT_NEAR(p.grad().to_vector<float>()[0], 0.6f, 1e-5);
    // Clipping again in the same step does not unscale twice.
    EXPECT_NEAR(acc.clip_grad_norm_({p}, 1.0), 1.0, 1e-5);
    o->step();  // uses the clipped gradient as it is
    o->zero_grad();
  }
  EXPECT_FALSE(acc.optimizer_step_was_skipped());
  EXPECT_NEAR(p.to_vector<float>()[0], 3.0f - 0.5f * 0.6f, 1e-5);
  EXPECT_NEAR(p.to_vector<float>()[1], 4.0f - 0.5f * 0.8f, 1e-5);
  ++it;
  {
    auto guard = acc.accumulate();
    acc.backward(sum(p * 2.0));
  }
  ++it;
  {
    auto guard = acc.accumulate();
    acc.backward(sum(p * 2.0));  // window total (2, 2)
    acc.clip_grad_value_({p}, 1.5);
    EXPECT_EQ(p.grad().to_vector<float>(), (std::vector<float>{1.5f, 1.5f}));  // unscaled, then clipped
    o->step();
  }
}

TEST(AcceleratorMixedPrecision, SaveStateRestoresTheLossScale) {
  ember::testing::TempDir dir("accel_scaler");
  const std::string ckpt = dir.file("fp16"), plain = dir.file("plain");
  const AcceleratorOptions fp16{.mixed_precision = "fp16", .scaler = {.init_scale = 1024.0, .growth_interval = 2}};
  double scale = 0;
  int64_t tracker = 0;
  {
    TrainingRun run(fp16);
    run.steps(5);  // f32 gradients: no overflow; the scale grows every 2 steps
    scale = run.acc.scaler()->get_scale();
    tracker = run.acc.scaler()->growth_tracker();
    EXPECT_EQ(scale, 4096.0);
    EXPECT_EQ(tracker, 1);
    run.acc.save_state(ckpt);
    EXPECT_TRUE(fs::exists(ckpt + "/scaler.safetensors"));
    run.steps(2);
    EXPECT_NE(run.acc.scaler()->get_scale(), scale);
  }
  {
    TrainingRun resumed(fp16);
    resumed.acc.load_state(ckpt);
    EXPECT_EQ(resumed.acc.scaler()->get_scale(), scale);
    EXPECT_EQ(resumed.acc.scaler()->growth_tracker(), tracker);
    EXPECT_EQ(resumed.counter.value, 5);
  }
  {
    // Without fp16 the scaler's file is neither written nor needed.
    TrainingRun run(AcceleratorOptions{});
    run.steps(1);
    run.acc.save_state(plain);
    EXPECT_FALSE(fs::exists(plain + "/scaler.safetensors"));
    run.acc.load_state(ckpt);  // an fp16 checkpoint loads into an f32 run
  }
  TrainingRun needs_scaler(fp16);
  needs_scaler.steps(1);
  const auto before = flat(*needs_scaler.model);
  EXPECT_EMBER_ERROR(needs_scaler.acc.load_state(plain), "load_state", plain + "/scaler.safetensors", "missing",
                     "fp16");
  EXPECT_EQ(flat(*needs_scaler.model), before);  // nothing changed
  // A damaged scaler file is named too.
  ObjectState broken;
  broken.scalars = {{"scale", 8.0}};
  {
    Accelerator writer;
    writer.save(broken, ckpt + "/scaler.safetensors");
  }
  EXPECT_EMBER_ERROR(needs_scaler.acc.load_state(ckpt), "load_state", ckpt + "/scaler.safetensors", "growth_factor");
  EXPECT_EQ(flat(*needs_scaler.model), before);
}
