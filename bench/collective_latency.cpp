// What the collective fingerprints cost: allreduce latency and bandwidth over Gloo with the
// fingerprint exchange on and off, alternating rounds in one run, plus barrier latency.
// Started by `ember launch`:
//
//   build/bin/ember launch --num_processes 2 build/bench/collective_latency [--rounds 5]
//
// Prints one row per size: median microseconds with and without fingerprints, the added
// microseconds, and the bus bandwidth (2 (n-1)/n bytes / time, as nccl-tests defines it).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/factory.h"
#include "core/tensor.h"
#include "distributed/process_group.h"
#include "distributed/rendezvous.h"

using namespace ember;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median microseconds of one collective over `iters` calls (after a short warm-up).
template <typename Fn>
double time_us(distributed::ProcessGroup& pg, int iters, Fn&& fn) {
  for (int i = 0; i < 5; ++i) fn();
  pg.barrier();
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    fn();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return median(us);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--rounds") rounds = std::max(1, std::atoi(argv[i + 1]));
  const auto info = distributed::rendezvous_info_from_env();
  if (info.world_size < 2) {
    std::fprintf(stderr, "collective_latency: start it with `ember launch --num_processes 2` (or more)\n");
    return 2;
  }
  auto store = distributed::rendezvous(info, std::chrono::seconds(60));
  distributed::ProcessGroupOptions on, off;
  off.fingerprint_collectives = false;
  // Two groups on one store (each its own key space): rounds alternate between them.
  auto with = distributed::new_process_group(store, info.rank, info.world_size, "gloo", on);
  auto without = distributed::new_process_group(store, info.rank, info.world_size, "gloo", off);
  const int n = info.world_size;
  if (info.rank == 0)
    std::printf("%-12s %12s %12s %10s %14s\n", "allreduce", "with us", "without us", "added us", "busbw GB/s");
  for (int64_t bytes : {int64_t(4), int64_t(4) << 10, int64_t(256) << 10, int64_t(4) << 20, int64_t(25) << 20}) {
    Tensor t = zeros({bytes / 4});
    const int iters = bytes >= (int64_t(4) << 20) ? 10 : 100;
    std::vector<double> w, wo;
    for (int r = 0; r < rounds; ++r) {
      w.push_back(time_us(*with, iters, [&] { with->allreduce(t)->wait(); }));
      wo.push_back(time_us(*without, iters, [&] { without->allreduce(t)->wait(); }));
    }
    const double mw = median(w), mwo = median(wo);
    const double busbw = 2.0 * (n - 1) / n * double(bytes) / (mwo * 1e-6) / 1e9;
    if (info.rank == 0)
      std::printf("%-12s %12.1f %12.1f %10.1f %14.3f\n", (std::to_string(bytes) + " B").c_str(), mw, mwo, mw - mwo, busbw);
  }
  std::vector<double> w, wo;
  for (int r = 0; r < rounds; ++r) {
    w.push_back(time_us(*with, 100, [&] { with->barrier(); }));
    wo.push_back(time_us(*without, 100, [&] { without->barrier(); }));
  }
  if (info.rank == 0)
    std::printf("%-12s %12.1f %12.1f %10.1f\n", "barrier", median(w), median(wo), median(w) - median(wo));
  return 0;
}
