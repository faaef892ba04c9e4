// One rank of a job started by `ember launch` (or with the launcher's variables set by hand):
// env:// rendezvous at MASTER_ADDR:MASTER_PORT, a Gloo process group over the store, and one
// all-reduce whose sum every rank checks.
//
//   rendezvous_allreduce [TIMEOUT_MS]     (default 20000, for the rendezvous and the group)
//
// Prints "rank R of N: allreduce ok via MASTER_ADDR=..." and exits 0. An ember::Error is
// printed to stderr with exit code 1; a wrong sum exits 2.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "distributed/process_group.h"
#include "distributed/rendezvous.h"
#include "ember/ember.h"

using namespace ember;
using namespace ember::distributed;

int main(int argc, char** argv) {
  const std::chrono::milliseconds timeout(argc > 1 ? std::atoll(argv[1]) : 20000);
  try {
    const RendezvousInfo info = rendezvous_info_from_env();
    std::shared_ptr<Store> store = rendezvous(info, timeout);
    ProcessGroupOptions opt;
    opt.timeout = timeout;
    auto pg = new_process_group(store, info.rank, info.world_size, "gloo", opt);
    // Rank r contributes r + 1 everywhere, so every element sums to n (n + 1) / 2.
    Tensor x = full({16}, double(info.rank + 1));
    pg->allreduce(x, ReduceOp::Sum)->wait();
    const float want = float(info.world_size * (info.world_size + 1) / 2);
    for (float v : x.to_vector<float>()) {
      if (v != want) {
        std::printf("rank %d: allreduce gave %g, expected %g\n", info.rank, double(v), double(want));
        return 2;
      }
    }
    // Rank 0 serves the store: nobody leaves before everyone is done with it.
    pg->barrier();
    std::printf("rank %d of %d: allreduce ok via MASTER_ADDR=%s\n", info.rank, info.world_size,
                info.master_addr.c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "rendezvous_allreduce: %s\n", e.what());
    return 1;
  }
}
