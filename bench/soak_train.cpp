// The training program of the soak benchmark (bench/soak.sh): bert-tiny fine-tuned on SST-2
// with the Accelerator, checkpointing every few steps, for a fixed number of optimizer steps.
// Killed and started again with --resume, it continues from its last checkpoint; the final
// weights of an interrupted run must equal those of an uninterrupted one bit for bit.
//
//   ember launch --num_processes 2 build/bench/soak_train --project-dir D --steps 20000
//       --checkpoint-every 2000 [--resume] [--rss-log D/rss]     (one command line)
//
// Every --rss-every steps each rank appends a line to <rss-log>.rank<N>, so a run's memory can
// be checked for growth after warm-up and any growth traced to who holds it:
//   <step> <seconds> <resident KiB> <tensor cache reserved KiB> <tensors in use KiB>
//   <malloc heap KiB> <malloc mmapped KiB> <longest batch so far (tokens)> At the end the
// main process writes <project-dir>/final/model.safetensors and prints "SOAK DONE <steps>".
// `soak_train --compare A B` compares two such files and exits 1 unless they are identical.
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "../examples/sst2_common.h"
#include "nn/io/safetensors.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd_adam.h"
#include "tracking/progress.h"
#include <ember/accelerate.h>

using namespace ember;

namespace {

struct Args {
  std::string project_dir, rss_log, data_dir = std::string(EMBER_SOURCE_DIR) + "/datasets";
  int64_t steps = 20000, checkpoint_every = 2000, rss_every = 200, batch = 32;
  // Phrases are cut at 40 tokens (1,491 of SST-2's 67,349 training phrases, 2.2%, are that long
  // or longer; the longest has 66). A rank's memory follows the longest batch it has run. Each
  // mega-batch of the length-grouped shuffle (1,600 phrases) then holds about 35 phrases of 40
  // tokens, so the first batch of nearly every mega-batch is 40 tokens long on both ranks (split
  // in two, the 16 longest to rank 0, the next 16 to rank 1), and each rank reaches its
  // high-water mark within its first few mega-batches. Uncut, a rank meets its longest batch when
  // one of the 2 phrases of 66 tokens happens to reach it, which can be hours in, and the
  // flat-memory check would measure the data rather than a leak.
  int64_t max_len = 40;
  bool resume = false;
  int threads = 1;
  uint64_t seed = 7;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--resume") {
      a.resume = true;
      continue;
    }
    EMBER_CHECK(i + 1 < argc, "soak_train: ", k, " needs a value");
    const std::string v = argv[++i];
    if (k == "--project-dir") a.project_dir = v;
    else if (k == "--rss-log") a.rss_log = v;
    else if (k == "--data-dir") a.data_dir = v;
    else if (k == "--steps") a.steps = std::stoll(v);
    else if (k == "--checkpoint-every") a.checkpoint_every = std::stoll(v);
    else if (k == "--rss-every") a.rss_every = std::stoll(v);
    else if (k == "--batch") a.batch = std::stoll(v);
    else if (k == "--max-len") a.max_len = std::stoll(v);
    else if (k == "--threads") a.threads = std::stoi(v);
    else if (k == "--seed") a.seed = std::stoull(v);
    else EMBER_FAIL("soak_train: unknown option ", k);
  }
  EMBER_CHECK(!a.project_dir.empty(), "soak_train: --project-dir is required");
  EMBER_CHECK(a.steps > 0 && a.checkpoint_every > 0 && a.rss_every > 0, "soak_train: counts must be positive");
  return a;
}

// Resident set size of this process in KiB, from /proc/self/statm.
long resident_kib() {
  std::ifstream statm("/proc/self/statm");
  long total = 0, resident = 0;
  statm >> total >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

// One memory sample: the resident set, then who holds what inside it.
std::string memory_sample(int64_t longest_batch) {
  const AllocatorStats tensors = cpu_allocator().stats();
  const struct mallinfo2 heap = mallinfo2();
  return std::to_string(resident_kib()) + ' ' + std::to_string(tensors.bytes_reserved / 1024) + ' ' +
         std::to_string(tensors.bytes_in_use / 1024) + ' ' + std::to_string(heap.arena / 1024) + ' ' +
         std::to_string(heap.hblkhd / 1024) + ' ' + std::to_string(longest_batch);
}

// The optimizer-step counter, saved and restored with the Accelerator's state.
struct StepCounter {
  int64_t value = 0;
  distributed::ObjectState state_dict() const { return {{}, {{"step", double(value)}}}; }
  void load_state_dict(const distributed::ObjectState& s) { value = int64_t(s.scalars.at("step")); }
};

int compare(const std::string& a, const std::string& b) {
  const auto x = nn::load_safetensors(a), y = nn::load_safetensors(b);
  EMBER_CHECK(x.size() == y.size(), "soak_train --compare: ", a, " has ", x.size(), " tensors, ", b, " has ", y.size());
  int64_t differing = 0;
  for (const auto& [name, tx] : x) {
    EMBER_CHECK(y.count(name), "soak_train --compare: ", name, " is missing from ", b);
    const Tensor& ty = y.at(name);
    EMBER_CHECK(tx.sizes() == ty.sizes(), "soak_train --compare: ", name, " has different shapes");
    const auto vx = tx.contiguous().to_vector<float>(), vy = ty.contiguous().to_vector<float>();
    if (std::memcmp(vx.data(), vy.data(), vx.size() * sizeof(float)) != 0) {
      ++differing;
      std::printf("differs: %s\n", name.c_str());
    }
  }
  std::printf("%zu tensors compared, %lld differ\n", x.size(), (long long)differing);
  return differing == 0 ? 0 : 1;
}

int train(const Args& a) {
  set_num_threads(a.threads);
  manual_seed(a.seed);
  Accelerator acc({.split_batches = true, .project_dir = a.project_dir, .total_limit = 2});
  sst2::Options data_options;
  data_options.data_dir = a.data_dir;
  data_options.batch = a.batch;
  data_options.max_len = a.max_len;
  data_options.seed = a.seed;
  const sst2::Data sst = sst2::load(data_options);
  auto model = std::make_shared<nn::BertForSequenceClassification>(nn::BertConfig::tiny(sst.vocab_size));
  optim::AdamW optimizer(model->parameters(), {.lr = 1e-4, .weight_decay = 0.01});
  data::DataLoader train_loader = sst2::train_loader(data_options, sst);
  auto scheduler = optim::get_scheduler("linear", optimizer, a.steps / 20, a.steps);
  auto [m, o, train, s] = acc.prepare(model, optimizer, train_loader, scheduler);
  auto step = std::make_shared<StepCounter>();
  acc.register_for_checkpointing(step);
  if (a.resume) acc.print("resumed from", acc.load_state(), "at step", step->value);

  std::ofstream rss;
  if (!a.rss_log.empty()) {
    const std::string path = a.rss_log + ".rank" + std::to_string(acc.process_index());
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    rss.open(path, std::ios::app);
    EMBER_CHECK(rss.is_open(), "soak_train: cannot append to ", path);
  }
  const auto start = std::chrono::steady_clock::now();
  ProgressBar bar("soak", a.steps);
  int64_t longest_batch = 0;
  m->train();
  // The loader counts epochs itself and resumes mid-epoch after load_state.
  while (step->value < a.steps) {
    for (auto& batch : *train) {
      longest_batch = std::max(longest_batch, batch.at("input_ids").size(1));
      auto out = m->forward(batch);
      acc.backward(out.loss);
      acc.clip_grad_norm_(m->parameters(), 1.0);
      o->step();
      s->step();
      o->zero_grad();
      ++step->value;
      if (rss.is_open() && step->value % a.rss_every == 0) {
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        rss << step->value << ' ' << seconds << ' ' << memory_sample(longest_batch) << std::endl;
      }
      if (acc.is_main_process()) bar.update(step->value, "loss " + std::to_string(out.loss.item<double>()));
      if (step->value % a.checkpoint_every == 0) acc.save_state();
      if (step->value == a.steps) break;
    }
  }
  if (acc.is_main_process()) bar.finish();
  acc.save_model(*m, a.project_dir + "/final");
  acc.print("SOAK DONE", step->value);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 4 && std::string(argv[1]) == "--compare") return compare(argv[2], argv[3]);
    return train(parse(argc, argv));
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
