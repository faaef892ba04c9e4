// Checks for the test programs that run as ranks: a failed check prints "rank R: FAILED what"
// and the program goes on, so one run reports every failed check; the program's exit status
// says whether any failed.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <string>

namespace ember::testing {

inline bool& worker_failed() {
  static bool failed = false;
  return failed;
}

inline void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("rank %s: FAILED %s\n", std::getenv("RANK") ? std::getenv("RANK") : "0", what.c_str());
    worker_failed() = true;
  }
}

}  // namespace ember::testing
