// One rank of tests/accelerate/test_load_state_atomic_processes.cpp:
//
//   load_state_worker <dir>   trains, saves <dir>/good (collective), then the main process
//                             copies it to <dir>/bad with random_states_1.json out of range
//                             (only rank 1 reads it). Every rank trains on, and load_state(bad)
//                             must fail on every rank (rank 1 naming its file, the others naming
//                             process 1) and leave each rank bitwise as it was; load_state(good)
//                             then succeeds everywhere. Prints "atomic ok".
// Exit status 0 when every expectation held.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>

#include "accelerate/accelerator.h"
#include "bitwise_snapshot.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "ddp_test_model.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd_adam.h"
#include "worker_expect.h"

using namespace ember;
using namespace ember::distributed;
using namespace ember::ddp_test;
namespace fs = std::filesystem;

namespace {

using ember::testing::expect;
bool& failed = ember::testing::worker_failed();

struct Counter {
  double value = 0;
  std::map<std::string, double> state_dict() const { return {{"value", value}}; }
  void load_state_dict(const std::map<std::string, double>& s) { value = s.at("value"); }
};

// Everything load_state may change on this rank, bitwise.
struct Snapshot {
  std::map<std::string, ember::testing::TensorBytes> weights, optimizer_tensors;
  std::map<std::string, uint64_t> optimizer_scalars;
  std::vector<uint64_t> lrs;
  std::vector<int64_t> counts;  // scheduler step, loader epoch and position
  uint64_t counter = 0;
  std::pair<uint64_t, uint64_t> generator;
  bool operator==(const Snapshot&) const = default;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: load_state_worker <dir>\n");
    return 2;
  }
  const std::string dir = argv[1], good = dir + "/good", bad = dir + "/bad";
  Accelerator acc;
  auto model = make_mlp(9);
  optim::AdamW opt(model->parameters(), {.lr = 0.01});
  auto sched = optim::get_scheduler("linear", opt, 1, 20);
  auto dataset = std::make_shared<data::TensorDataset>(std::map<std::string, Tensor>{
      {"x", uniform_tensor(40, {24, kIn})}, {"y", uniform_tensor(41, {24, kOut})}});
  data::DataLoader loader(dataset, {.batch_size = 2, .shuffle = true, .seed = 3});
  // Named variables, not a structured binding: the lambdas below capture them (clang 14, which
  // the sanitizer build uses, cannot capture structured bindings).
  const auto prepared = acc.prepare(model, opt, loader, sched);
  const auto& m = std::get<0>(prepared);
  const auto& o = std::get<1>(prepared);
  const auto& l = std::get<2>(prepared);
  const auto& s = std::get<3>(prepared);
  Counter counter;
  acc.register_for_checkpointing(counter);
  auto train = [&](int n) {
    for (auto& batch : *l) {
      acc.backward(nn::functional::mse_loss(m->forward(batch["x"]), batch["y"]));
      o->step();
      s->step();
      o->zero_grad();
      counter.value += 1;
      (void)dropout(batch["x"], 0.2, true);  // moves the generator
      if (--n == 0) return;
    }
  };
  auto snapshot = [&] {
    Snapshot out;
    out.weights = ember::testing::tensors_bytes(model->state_dict());
    const auto sd = o->state_dict();
    out.optimizer_tensors = ember::testing::tensors_bytes(sd.tensors);
    out.optimizer_scalars = ember::testing::scalars_bits(sd.scalars);
    for (double lr : s->get_last_lr()) out.lrs.push_back(ember::testing::double_bits(lr));
    out.counts = {s->last_step(), l->epoch(), l->position()};
    out.counter = ember::testing::double_bits(counter.value);
    const GeneratorState g = default_generator().get_state();
    out.generator = {g.seed, g.offset};
    return out;
  };

  train(3);
  acc.save_state(good);
  if (acc.is_main_process()) {
    fs::copy(good, bad, fs::copy_options::recursive);
    const std::string rng = bad + "/random_states_1.json";
    nlohmann::json j = nlohmann::json::parse(std::ifstream(rng));
    j["offset"] = -3;
    std::ofstream(rng) << j.dump();
  }
  acc.wait_for_everyone();
  train(2);

  const Snapshot before = snapshot();
  std::string message;
  try {
    acc.load_state(bad);
  } catch (const Error& e) {
    message = e.what();
  }
  std::printf("rank %d refused: %s\n", acc.process_index(), message.c_str());
  expect(!message.empty(), "load_state of the bad checkpoint failed");
  expect(message.find("random_states_1.json") != std::string::npos, "the error names random_states_1.json");
  if (acc.process_index() == 1) {
    expect(message.find("'offset' is -3") != std::string::npos, "rank 1 names the field");
  } else {
    expect(message.find("process 1 failed") != std::string::npos, "the other ranks name process 1");
  }
  expect(snapshot() == before, "the refused load changed nothing on this rank");

  acc.load_state(good);
  expect(counter.value == 3.0 && l->position() == 3 && s->last_step() == 3 * acc.num_processes(),
         "the good checkpoint loads afterwards");
  acc.wait_for_everyone();
  if (!failed) std::printf("atomic ok\n");
  return failed ? 1 : 0;
}
