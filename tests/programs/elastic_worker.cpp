// A training program for tests/distributed/test_elastic_launch.cpp, run by `ember launch`:
// the same program serves the first start and every restart (load_state() at the top, an
// automatic checkpoint every 2 optimizer steps through maybe_save_state()).
//
//   elastic_worker <project_dir> <weights_out> [--micro N] [--kill RANK:RESTART:STEP]...
//                  [--stop RANK:STEP:PIDFILE]
//
// Trains an MLP (accumulation over 2 micro-batches, dropout so the generator matters) until N
// backward passes (default 24) are done, then process 0 writes every parameter's bytes to
// <weights_out> (name, then raw f32) and prints "elastic done". --kill makes RANK kill itself with
// SIGKILL right after backward pass STEP in restart RESTART (EMBER_RESTART_COUNT); --stop makes
// RANK write its pid to PIDFILE and stop itself with SIGSTOP after pass STEP in the first attempt.
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "accelerate/accelerator.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "ddp_test_model.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd_adam.h"

using namespace ember;
using namespace ember::distributed;
using namespace ember::ddp_test;

namespace {

struct Kill {
  int rank = 0, restart = 0;
  int64_t step = 0;
};

struct Stop {
  int rank = -1;
  int64_t step = 0;
  std::string pid_file;
};

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : 0;
}

// "A:B:C" split at the colons.
std::vector<std::string> fields(const std::string& text) {
  std::vector<std::string> out(1);
  for (char c : text) {
    if (c == ':') out.emplace_back();
    else out.back() += c;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: elastic_worker <project_dir> <weights_out> [--micro N] [--kill R:RESTART:STEP]... "
                         "[--stop R:STEP:PIDFILE]\n");
    return 2;
  }
  const std::string project = argv[1], weights_out = argv[2];
  int64_t micro = 24;
  std::vector<Kill> kills;
  Stop stop;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::vector<std::string> f = fields(argv[i + 1]);
    if (flag == "--micro") micro = std::atoll(argv[i + 1]);
    else if (flag == "--kill" && f.size() == 3) kills.push_back({std::stoi(f[0]), std::stoi(f[1]), std::stoll(f[2])});
    else if (flag == "--stop" && f.size() == 3) stop = {std::stoi(f[0]), std::stoll(f[1]), f[2]};
    else {
      std::fprintf(stderr, "elastic_worker: bad argument %s %s\n", argv[i], argv[i + 1]);
      return 2;
    }
  }
  const int rank = env_int("RANK"), restart = env_int("EMBER_RESTART_COUNT");

  Accelerator acc({.gradient_accumulation_steps = 2, .project_dir = project, .total_limit = 2,
                   .checkpoint_every_n_steps = 2});
  acc.set_seed(11);
  auto model = make_mlp(9);
  optim::AdamW opt(model->parameters(), {.lr = 0.01});
  auto sched = optim::get_scheduler("linear", opt, 2, 40);
  auto dataset = std::make_shared<data::TensorDataset>(std::map<std::string, Tensor>{
      {"x", uniform_tensor(40, {24, kIn})}, {"y", uniform_tensor(41, {24, kOut})}});
  data::DataLoader loader(dataset, {.batch_size = 2, .shuffle = true, .seed = 3});
  auto [m, o, l, s] = acc.prepare(model, opt, loader, sched);

  const std::string resumed = acc.load_state();  // nothing on the first start
  std::printf("rank %d restart %d resumed from '%s' at pass %lld\n", rank, restart, resumed.c_str(),
              static_cast<long long>(acc.backward_passes()));
  std::fflush(stdout);

  while (acc.backward_passes() < micro) {
    for (auto& batch : *l) {
      {
        auto guard = acc.accumulate(m);
        const Tensor x = dropout(batch["x"], 0.2, true);
        acc.backward(nn::functional::mse_loss(m->forward(x), batch["y"]));
        o->step();
        s->step();
        o->zero_grad();
      }
      const int64_t pass = acc.backward_passes();
      for (const Kill& k : kills)
        if (k.rank == rank && k.restart == restart && k.step == pass) ::raise(SIGKILL);
      if (stop.rank == rank && restart == 0 && stop.step == pass) {
        std::ofstream(stop.pid_file) << ::getpid() << "\n";
        ::raise(SIGSTOP);
      }
      acc.maybe_save_state();
      if (pass >= micro) break;
    }
  }

  if (acc.is_main_process()) {
    std::ofstream out(weights_out, std::ios::binary);
    for (const auto& [name, p] : model->named_parameters()) {
      const Tensor c = p.contiguous();
      out << name << "\n";
      out.write(static_cast<const char*>(c.raw_data()), std::streamsize(c.numel() * int64_t(c.element_size())));
    }
  }
  acc.wait_for_everyone();
  std::printf("rank %d elastic done\n", rank);
  return 0;
}
