// Threads as ranks: one ProcessGroupGloo per thread over a shared HashStore, for tests that
// need several ranks but not several processes.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "distributed/hash_store.h"
#include "distributed/process_group_gloo.h"

namespace ember::test {

// Runs fn(pg) on `world` threads, one rank each; returns each rank's error message ("" = none).
inline std::vector<std::string> run_ranks(int world,
                                          const std::function<void(std::shared_ptr<distributed::ProcessGroup>)>& fn,
                                          std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  auto store = std::make_shared<distributed::HashStore>(timeout);
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        distributed::ProcessGroupOptions opt;
        opt.timeout = timeout;
        auto pg = std::make_shared<distributed::ProcessGroupGloo>(store, r, world, opt);
        fn(pg);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
        if (errors[size_t(r)].empty()) errors[size_t(r)] = "empty error";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

inline void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace ember::test
