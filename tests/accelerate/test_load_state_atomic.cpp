// Accelerator::load_state in two phases: a hostile checkpoint is refused, naming the file and
// the field, before anything changes. After each refused load every parameter, optimizer
// buffer and step, learning rate, loader position, registered object and the generator are
// bitwise as they were. The two-process case is in test_load_state_atomic_processes.cpp.
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "bitwise_snapshot.h"
#include "ddp_test_model.h"
#include "ember/accelerate.h"
#include "nn/io/safetensors.h"
#include "test_util.h"

using namespace ember;
using namespace ember::distributed;
using namespace ember::ddp_test;
using ember::testing::double_bits;
using ember::testing::scalars_bits;
using ember::testing::TensorBytes;
using ember::testing::tensors_bytes;
namespace fs = std::filesystem;

namespace {

const bool kProcessOnCpu = [] {
  AcceleratorState::initialize(/*cpu=*/true, std::chrono::seconds(30));
  return true;
}();

std::shared_ptr<data::TensorDataset> make_dataset(int64_t n) {
  return std::make_shared<data::TensorDataset>(
      std::map<std::string, Tensor>{{"x", uniform_tensor(100, {n, kIn})}, {"y", uniform_tensor(101, {n, kOut})}});
}

struct Counter {
  double value = 0;
  std::map<std::string, double> state_dict() const { return {{"value", value}}; }
  void load_state_dict(const std::map<std::string, double>& s) { value = s.at("value"); }
};

// Refuses a negative value in its own load_state_dict, after it has taken it: only a rollback
// can leave it as it was.
struct Picky {
  double value = 0;
  std::map<std::string, double> state_dict() const { return {{"value", value}}; }
  void load_state_dict(const std::map<std::string, double>& s) {
    value = s.at("value");
    EMBER_CHECK(value >= 0, "Picky: negative value ", value);
  }
};

// 20 samples in batches of 3: 7 batches per epoch.
struct TrainingRun {
  explicit TrainingRun(uint64_t model_seed)
      : model(make_mlp(model_seed)), opt(model->parameters(), {.lr = 0.02}),
        loader(make_dataset(20), {.batch_size = 3, .shuffle = true, .seed = 8}) {
    sched = optim::get_scheduler("cosine", opt, 2, 30);
    std::tie(m, o, l, s) = acc.prepare(model, opt, loader, sched);
    acc.register_for_checkpointing(counter, picky);
  }
  void steps(int n) {
    for (auto& b : *l) {
      acc.backward(nn::functional::mse_loss(m->forward(b["x"]), b["y"]));
      o->step();
      s->step();
      o->zero_grad();
      counter.value += 1;
      picky.value += 0.5;
      (void)dropout(b["x"], 0.3, true);  // moves the generator
      if (--n == 0) return;
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
  Picky picky;
};

// Everything load_state may change, bitwise.
struct Snapshot {
  explicit Snapshot(const TrainingRun& r) {
    weights = tensors_bytes(r.model->state_dict());
    const auto sd = r.o->state_dict();
    optimizer_tensors = tensors_bytes(sd.tensors);
    optimizer_scalars = scalars_bits(sd.scalars);
    for (double lr : r.s->get_last_lr()) lrs.push_back(double_bits(lr));
    scheduler_step = r.s->last_step();
    loader = {r.l->epoch(), r.l->position()};
    objects = {double_bits(r.counter.value), double_bits(r.picky.value)};
    const GeneratorState g = default_generator().get_state();
    generator = {g.seed, g.offset};
  }
  bool operator==(const Snapshot&) const = default;
  std::map<std::string, TensorBytes> weights, optimizer_tensors;
  std::map<std::string, uint64_t> optimizer_scalars;
  std::vector<uint64_t> lrs;
  int64_t scheduler_step = 0;
  std::pair<int64_t, int64_t> loader;
  std::vector<uint64_t> objects;
  std::pair<uint64_t, uint64_t> generator;
};

void edit_object_file(const std::string& path, const std::function<void(nn::SafetensorsFile&)>& edit) {
  nn::SafetensorsFile f = nn::load_safetensors_with_metadata(path);
  edit(f);
  nn::save_safetensors(path, f.tensors, f.metadata);
}

void edit_json(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
  edit(j);
  std::ofstream(path) << j.dump();
}

class LoadStateAtomic : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kProcessOnCpu);
    TrainingRun saver(5);
    saver.steps(5);
    saver.acc.save_state(good_);
    saved_weights_ = tensors_bytes(saver.model->state_dict());
    target_.steps(4);
  }

  // A copy of the good checkpoint, edited by `tamper`, must be refused with every fragment in
  // the message (`file` among them), and change nothing.
  void expect_refused(const std::string& file, const std::function<void(const std::string& dir)>& tamper,
                      std::vector<std::string> fragments) {
    const std::string bad = dir_.file("bad" + std::to_string(cases_++));
    fs::copy(good_, bad, fs::copy_options::recursive);
    tamper(bad);
    const Snapshot before(target_);
    fragments.insert(fragments.begin(), bad + "/" + file);
    try {
      target_.acc.load_state(bad);
      ADD_FAILURE() << "load_state(" << file << " tampered) did not refuse";
    } catch (const Error& e) {
      for (const auto& f : fragments)
        EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << "message \"" << e.what() << "\" lacks \"" << f << "\"";
    }
    EXPECT_TRUE(Snapshot(target_) == before) << "a refused load of a tampered " << file << " changed the run";
  }

  ember::testing::TempDir dir_{"load_state_atomic"};
  const std::string good_ = dir_.file("good");
  std::map<std::string, TensorBytes> saved_weights_;
  TrainingRun target_{7};
  int cases_ = 0;
};

}  // namespace

TEST_F(LoadStateAtomic, WrongShapeWeightAfterGoodOnes) {
  expect_refused("model.safetensors", [](const std::string& d) {
    auto w = nn::load_safetensors(d + "/model.safetensors");
    w["fc3.weight"] = zeros({5, 5});  // fc1.* and fc2.* come first and are fine
    nn::save_safetensors(d + "/model.safetensors", w, {{"format", "pt"}});
  }, {"does not match the model (Mlp)", "fc3.weight is [5, 5] in the checkpoint but [3, 16] in the model"});
}

TEST_F(LoadStateAtomic, WrongDtypeWeight) {
  expect_refused("model.safetensors", [](const std::string& d) {
    auto w = nn::load_safetensors(d + "/model.safetensors");
    w["fc3.bias"] = zeros({kOut}, {.dtype = DType::i64});
    nn::save_safetensors(d + "/model.safetensors", w, {{"format", "pt"}});
  }, {"dtype mismatch", "fc3.bias is int64 in the checkpoint but float32 in the model"});
}

TEST_F(LoadStateAtomic, OptimizerTensorOfTheWrongShape) {
  expect_refused("optimizer.safetensors", [](const std::string& d) {
    edit_object_file(d + "/optimizer.safetensors", [](nn::SafetensorsFile& f) {
      f.tensors["state.5.exp_avg"] = zeros({9});
    });
  }, {"'state.5.exp_avg' has shape [9]", "parameter 5 has shape [3]"});
}

TEST_F(LoadStateAtomic, NanOptimizerStep) {
  expect_refused("optimizer.safetensors", [](const std::string& d) {
    edit_object_file(d + "/optimizer.safetensors", [](nn::SafetensorsFile& f) { f.metadata["scalar.state.0.step"] = "nan"; });
  }, {"'state.0.step' is nan", "non-negative integer"});
}

TEST_F(LoadStateAtomic, SchedulerMissingKey) {
  expect_refused("scheduler.safetensors", [](const std::string& d) {
    edit_object_file(d + "/scheduler.safetensors", [](nn::SafetensorsFile& f) { f.metadata.erase("scalar.step"); });
  }, {"missing 'step'"});
}

TEST_F(LoadStateAtomic, SchedulerStepMinusFive) {
  expect_refused("scheduler.safetensors", [](const std::string& d) {
    edit_object_file(d + "/scheduler.safetensors", [](nn::SafetensorsFile& f) { f.metadata["scalar.step"] = "-5"; });
  }, {"'step' is -5"});
}

TEST_F(LoadStateAtomic, LoaderPositionPastTheEpoch) {
  expect_refused("accelerator_state.json", [](const std::string& d) {
    edit_json(d + "/accelerator_state.json", [](nlohmann::json& j) { j["dataloaders"][0]["position"] = 7; });
  }, {"dataloaders[0]", "batch 7", "an epoch has 7 batches"});
  expect_refused("accelerator_state.json", [](const std::string& d) {
    edit_json(d + "/accelerator_state.json", [](nlohmann::json& j) { j["dataloaders"][0]["position"] = -1; });
  }, {"'dataloaders[0].position' is -1", "non-negative integer"});
}

TEST_F(LoadStateAtomic, RegisteredObjectMissingKey) {
  expect_refused("custom_checkpoint.safetensors", [](const std::string& d) {
    edit_object_file(d + "/custom_checkpoint.safetensors", [](nn::SafetensorsFile& f) { f.metadata.erase("scalar.value"); });
  }, {"missing scalar 'value'"});
}

TEST_F(LoadStateAtomic, RegisteredObjectRefusingItsOwnLoadIsRolledBack) {
  // Counter (custom_checkpoint) loads, then Picky takes -1 and refuses: both are put back.
  expect_refused("custom_checkpoint_1.safetensors", [](const std::string& d) {
    edit_object_file(d + "/custom_checkpoint_1.safetensors", [](nn::SafetensorsFile& f) { f.metadata["scalar.value"] = "-1"; });
  }, {"Picky: negative value -1"});
}

TEST_F(LoadStateAtomic, MissingRandomStatesFileIsNamed) {
  expect_refused("random_states_0.json", [](const std::string& d) { fs::remove(d + "/random_states_0.json"); },
                 {"is missing"});
  expect_refused("random_states_0.json", [](const std::string& d) {
    edit_json(d + "/random_states_0.json", [](nlohmann::json& j) { j["offset"] = -3; });
  }, {"'offset' is -3"});
}

TEST_F(LoadStateAtomic, TheGoodCheckpointStillLoadsAfterTheRefusals) {
  expect_refused("scheduler.safetensors", [](const std::string& d) {
    edit_object_file(d + "/scheduler.safetensors", [](nn::SafetensorsFile& f) { f.metadata["scalar.step"] = "2.5"; });
  }, {"'step' is 2.5"});
  target_.acc.load_state(good_);
  EXPECT_EQ(tensors_bytes(target_.model->state_dict()), saved_weights_);
  EXPECT_EQ(target_.l->position(), 5);
  EXPECT_EQ(target_.counter.value, 5);
  EXPECT_EQ(target_.picky.value, 2.5);
  EXPECT_EQ(target_.s->last_step(), 5);
}
