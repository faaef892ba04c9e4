// One process of an Accelerator job that saves a checkpoint under one split of the model and
// loads it under another, started by tests/accelerate/test_sharded_checkpoint_processes.cpp
// with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT. <split> is a sharding strategy name, with
// ":FULL" for state_dict_type FULL_STATE_DICT (FULL_SHARD:FULL), or DDP (no sharding). The global batch is 12 rows at every world size, so every run sees the same
// samples in each step.
//
//   reshard_worker save <split> <dir>    an epoch of 6 AdamW steps; after the third
//                                        save_state(<dir>/ckpt) and the whole model to
//                                        <dir>/saved.safetensors and save_model to
//                                        <dir>/saved_model; at the end the whole model to
//                                        <dir>/final.safetensors; prints "save ok"
//   reshard_worker load <split> <dir> <exact>
//                                        the same job under this split and world size:
//                                        load_state(<dir>/ckpt) gives saved.safetensors bit for
//                                        bit, 3 more steps give final.safetensors (bit for bit
//                                        when <exact> is 1, else within 1e-5); prints "load ok"
//   reshard_worker refuse <split> <dir>  load_state(<dir>/ckpt) raises and the model is as it
//                                        was; prints the error and "refuse ok"
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "accelerate/accelerator.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "ddp_test_model.h"
#include "nn/io/safetensors.h"
#include "optim/sgd_adam.h"
#include "worker_expect.h"

using namespace ember;
using namespace ember::distributed;
using namespace ember::ddp_test;

namespace {

using ember::testing::expect;
bool& failed = ember::testing::worker_failed();

constexpr int64_t kGlobalBatch = 12, kSteps = 3;

struct Job {
  std::unique_ptr<Accelerator> acc;
  std::shared_ptr<Mlp> model;
  std::shared_ptr<AcceleratedOptimizer> opt;
  std::shared_ptr<AcceleratedDataLoader> loader;
};

Job make_job(const std::string& split) {
  AcceleratorOptions options;
  if (split != "DDP") {
    FSDPOptions f;
    const size_t colon = split.find(':');
    f.sharding_strategy = parse_sharding_strategy(split.substr(0, colon));
    if (colon != std::string::npos) {
      expect(split.substr(colon + 1) == "FULL", "the only suffix is :FULL");
      f.state_dict_type = StateDictType::FULL_STATE_DICT;
    }
    f.transformer_layer_cls_to_wrap = {"Linear"};
    options.fsdp = f;
  }
  Job job;
  job.acc = std::make_unique<Accelerator>(options);
  const int64_t b = kGlobalBatch / job.acc->num_processes();
  auto ds = std::make_shared<data::TensorDataset>(std::map<std::string, Tensor>{
      {"x", uniform_tensor(300, {kGlobalBatch * 2 * kSteps, kIn})},
      {"y", uniform_tensor(301, {kGlobalBatch * 2 * kSteps, kOut})}});
  job.model = make_mlp(1, false, /*with_buffer=*/true);
  auto opt = std::make_shared<optim::AdamW>(job.model->parameters(), optim::AdamWOptions{.lr = 0.01});
  data::DataLoader loader(ds, {.batch_size = b, .shuffle = true, .seed = 5});
  auto [m, o, l] = job.acc->prepare(job.model, opt, loader);
  job.opt = o;
  job.loader = l;
  return job;
}

// Trains on the rest of the loader's epoch (one AdamW step per batch), calling at_batch after
// each step with the number of batches handed out so far.
template <typename F>
void train_epoch(Job& job, F&& at_batch) {
  for (auto& batch : *job.loader) {
    job.acc->backward(nn::functional::mse_loss(job.model->forward(batch["x"]), batch["y"]));
    job.opt->step();
    job.opt->zero_grad();
    at_batch(job.loader->position());
  }
}

// The whole model (collective under sharding), as copies.
nn::StateDict whole_model(Job& job) {
  nn::StateDict out;
  if (auto f = job.acc->fsdp(*job.model)) {
    for (auto& [name, t] : f->full_state_dict()) out[name] = t;
  } else {
    for (auto& [name, t] : job.model->state_dict()) out[name] = t.clone();
  }
  return out;
}

double max_abs_diff(const nn::StateDict& a, const nn::StateDict& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.shape() != t.shape()) return INFINITY;
    const auto x = t.to_vector<float>(), y = it->second.to_vector<float>();
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, double(std::abs(x[i] - y[i])));
  }
  return worst;
}

int run_save(const std::string& split, const std::string& dir) {
  Job job = make_job(split);
  train_epoch(job, [&](int64_t done) {
    if (done != kSteps) return;
    job.acc->save_state(dir + "/ckpt");
    job.acc->save(whole_model(job), dir + "/saved.safetensors");
    job.acc->save_model(job.model, dir + "/saved_model");  // gathers a sharded model
  });
  job.acc->save(whole_model(job), dir + "/final.safetensors");
  job.acc->wait_for_everyone();
  std::printf("rank %d saved under %s\n", job.acc->process_index(), split.c_str());
  if (!failed) std::printf("save ok\n");
  return failed ? 1 : 0;
}

int run_load(const std::string& split, const std::string& dir, bool exact) {
  Job job = make_job(split);
  job.acc->load_state(dir + "/ckpt");
  const double loaded = max_abs_diff(whole_model(job), nn::load_safetensors(dir + "/saved.safetensors"));
  int64_t steps = 0;
  train_epoch(job, [&](int64_t) { ++steps; });
  expect(steps == kSteps, "the loader resumes after the saved batch, got " + std::to_string(steps) + " steps");
  const double after = max_abs_diff(whole_model(job), nn::load_safetensors(dir + "/final.safetensors"));
  std::printf("rank %d of %d under %s: loaded differs by %.3g, 3 steps later by %.3g\n", job.acc->process_index(),
              job.acc->num_processes(), split.c_str(), loaded, after);
  expect(loaded == 0, "load_state restores the saved model bit for bit");
  expect(exact ? after == 0 : after <= 1e-5, "training resumes as the uninterrupted run (optimizer state resharded)");
  job.acc->wait_for_everyone();
  if (!failed) std::printf("load ok\n");
  return failed ? 1 : 0;
}

int run_refuse(const std::string& split, const std::string& dir) {
  Job job = make_job(split);
  const nn::StateDict before = whole_model(job);
  try {
    job.acc->load_state(dir + "/ckpt");
    expect(false, "load_state refuses the damaged checkpoint");
  } catch (const std::exception& e) {
    std::printf("load_state refused: %s\n", e.what());
  }
  expect(max_abs_diff(whole_model(job), before) == 0, "a refused load changes nothing");
  if (!failed) std::printf("refuse ok\n");
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "save" && argc == 4) return run_save(argv[2], argv[3]);
    if (mode == "load" && argc == 5) return run_load(argv[2], argv[3], std::atoi(argv[4]) != 0);
    if (mode == "refuse" && argc == 4) return run_refuse(argv[2], argv[3]);
    std::fprintf(stderr, "usage: reshard_worker save|load|refuse <split> <dir> [<exact>]\n");
    return 2;
  } catch (const std::exception& e) {
    std::printf("failed: %s\n", e.what());
    return 1;
  }
}
