// The child process of tests/distributed/test_faults.cpp: one fault scenario per run. Prints
// "ERROR: <message>" and exits 3 when ember::Error was raised, 1 on an unexpected outcome.
//
//   fault_worker save_loop <ckpt>          train and save_state(<ckpt>) forever ("SAVED <n>" each time)
//   fault_worker load <ckpt>               load_state(<ckpt>), check it, print "LOADED <n>"
//   fault_worker disk_full <ckpt> <bytes>  save once, then save again under RLIMIT_FSIZE=<bytes>
//   fault_worker collective <scenario> <timeout_ms>
//       env:// rendezvous (MASTER_ADDR/PORT, RANK, WORLD_SIZE, as `ember launch` sets them), a
//       gloo group, one all-reduce, then: "kill_mid_allreduce" (rank 1 SIGKILLs itself while the
//       others all-reduce), "master_dies" (rank 0, the store server, exits 0.7 s after starting,
//       never getting past the rendezvous, while the others wait) or "ok".
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "accelerate/accelerator.h"
#include "ddp_test_model.h"
#include "distributed/process_group.h"
#include "distributed/rendezvous.h"
#include "optim/sgd_adam.h"

using namespace ember;
using namespace ember::distributed;
using namespace ember::ddp_test;

namespace {

// A large custom object, so a save spends real time writing (and a kill lands inside it), whose
// tensor must agree with its step counter after a load.
struct Big {
  double step = 0;
  Tensor data = zeros({int64_t(1) << 21});
  ObjectState state_dict() const { return {{{"data", data}}, {{"step", step}}}; }
  void load_state_dict(const ObjectState& s) {
    data = s.tensors.at("data");
    step = s.scalars.at("step");
  }
};

struct Run {
  Accelerator acc{AcceleratorOptions{.cpu = true}};
  std::shared_ptr<Mlp> model = make_mlp(1);
  std::shared_ptr<optim::AdamW> opt = std::make_shared<optim::AdamW>(model->parameters(), optim::AdamWOptions{});
  std::shared_ptr<Big> big = std::make_shared<Big>();
  std::shared_ptr<nn::Module> m;
  Run() {
    auto prepared = acc.prepare(model, opt);
    m = std::get<0>(prepared);
    acc.register_for_checkpointing(big);
  }
  void step() {
    Tensor x = uniform_tensor(uint64_t(big->step) + 11, {4, kIn});
    Tensor loss = sum(model->forward(x));
    acc.backward(loss);
    opt->step();
    opt->zero_grad();
    big->step += 1;
    big->data = full({int64_t(1) << 21}, big->step);
  }
};

int collective(const std::string& scenario, int timeout_ms) {
  const auto timeout = std::chrono::milliseconds(timeout_ms);
  const RendezvousInfo info = rendezvous_info_from_env();
  if (scenario == "master_dies" && info.rank == 0) {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(700));
      std::_Exit(0);
    }).detach();
  }
  auto store = rendezvous(info, timeout);
  if (scenario == "master_dies" && info.rank == 0) std::this_thread::sleep_for(std::chrono::hours(1));
  ProcessGroupOptions opt;
  opt.timeout = timeout;
  auto pg = new_process_group(store, info.rank, info.world_size, "gloo", opt);
  Tensor x = ones({1 << 16});
  pg->allreduce(x)->wait();
  if (scenario == "kill_mid_allreduce" && info.rank == 1) raise(SIGKILL);
  if (scenario == "kill_mid_allreduce") {
    pg->allreduce(x)->wait();
    std::cout << "UNEXPECTED: allreduce succeeded" << std::endl;
    return 1;
  }
  std::cout << "OK" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: fault_worker save_loop|load|disk_full|collective ..." << std::endl;
    return 2;
  }
  const std::string mode = argv[1];
  try {
    if (mode == "collective") return collective(argv[2], argc > 3 ? std::atoi(argv[3]) : 3000);
    const std::string ckpt = argv[2];
    Run run;
    if (mode == "save_loop") {
      for (int n = 1;; ++n) {
        run.step();
        run.acc.save_state(ckpt);
        std::cout << "SAVED " << n << std::endl;
      }
    }
    if (mode == "load") {
      run.acc.load_state(ckpt);
      const auto v = run.big->data.to_vector<float>();
      for (float f : v)
        if (f != float(run.big->step)) {
          std::cout << "MISMATCH: data " << f << " but step " << run.big->step << std::endl;
          return 1;
        }
      std::cout << "LOADED " << run.big->step << std::endl;
      return 0;
    }
    if (mode == "disk_full" && argc > 3) {
      run.step();
      run.acc.save_state(ckpt);
      std::cout << "SAVED 1" << std::endl;
      ::signal(SIGXFSZ, SIG_IGN);
      const rlim_t limit = rlim_t(std::atoll(argv[3]));
      rlimit rl{limit, limit};
      if (::setrlimit(RLIMIT_FSIZE, &rl) != 0) {
        std::perror("setrlimit");
        return 2;
      }
      run.step();
      run.acc.save_state(ckpt);
      std::cout << "UNEXPECTED: the save under the file size limit succeeded" << std::endl;
      return 1;
    }
    std::cerr << "fault_worker: unknown mode " << mode << std::endl;
    return 2;
  } catch (const Error& e) {
    std::cout << "ERROR: " << e.what() << std::endl;
    return 3;
  }
}
