// One process of a tracked job, started by tests/tracking/test_tracking.cpp with
// RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT:
//
//   tracking_worker <dir>   log_with "all", project_dir <dir>/rank<process index>; init_trackers
//                           "run", three log() calls, end_training. Only the main process may
//                           hold trackers; prints "tracking ok" when that held.
// Exit status 0 when every expectation held.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "accelerate/accelerator.h"

using namespace ember::distributed;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: tracking_worker <dir>\n");
    return 2;
  }
  const std::string rank = std::getenv("RANK") ? std::getenv("RANK") : "0";
  AcceleratorOptions options;
  options.log_with = {"all"};
  options.project_dir = std::string(argv[1]) + "/rank" + rank;
  Accelerator acc(options);
  acc.init_trackers("run", {{"num_processes", acc.num_processes()}});
  for (int i = 1; i <= 3; ++i) acc.log({{"loss", 1.0 / (1 << (i - 1))}}, i);  // 1, 0.5, 0.25
  const bool has_trackers = acc.get_tracker("jsonl") != nullptr && acc.get_tracker("tensorboard") != nullptr;
  if (has_trackers != acc.is_main_process()) {
    std::printf("rank %s: FAILED trackers %s on a %s process\n", rank.c_str(), has_trackers ? "active" : "missing",
                acc.is_main_process() ? "main" : "non-main");
    return 1;
  }
  acc.end_training();
  acc.wait_for_everyone();
  std::printf("rank %s: tracking ok\n", rank.c_str());
  return 0;
}
