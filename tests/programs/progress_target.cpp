// A program for the progress tests of `ember launch`: every rank runs a ProgressBar "work" over
// --steps N items (default 5), one every --step-ms milliseconds (default 100), with the postfix
// "rank R", prints a line above the bar half way ("half way on rank R"), and ends with
// "done rank R" on stdout.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "tracking/progress.h"

int main(int argc, char** argv) {
  int64_t steps = 5;
  int step_ms = 100;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--steps") steps = std::atoll(argv[i + 1]);
    else if (flag == "--step-ms") step_ms = std::atoi(argv[i + 1]);
  }
  const char* rank_env = std::getenv("RANK");
  const std::string rank = rank_env ? rank_env : "0";
  {
    ember::ProgressBar bar("work", steps, "item");
    for (int64_t step = 1; step <= steps; ++step) {
      std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
      bar.update(step, "rank " + rank);
      if (step == steps / 2) bar.print("half way on rank " + rank);
    }
  }
  std::printf("done rank %s\n", rank.c_str());
  return 0;
}
