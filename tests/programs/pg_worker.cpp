// One rank of a multi-process process-group test: connects to the test's TcpStore, builds a
// group and runs one scenario. Prints "OK" and exits 0 on success; prints "ERROR: <message>" and
// exits 3 when a collective raised ember::Error, 1 on a wrong result.
//
//   pg_worker --port P --rank R --size N [--host H] [--backend gloo] [--timeout-ms T]
//             [--scenario check|bench|die_before_allreduce|kill_before_allreduce|hang_before_allreduce
//                         |kill_before_allgather_into]
//             [--victim V] [--bench-iters K] [--serve-store 1]
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <thread>

#include "distributed/process_group.h"
#include "distributed/tcp_store.h"
#include "ember/ember.h"

using namespace ember;
using namespace ember::distributed;

namespace {

std::map<std::string, std::string> parse(int argc, char** argv) {
  std::map<std::string, std::string> a = {{"host", "127.0.0.1"}, {"backend", "gloo"}, {"timeout-ms", "5000"},
                                          {"scenario", "check"}, {"victim", "1"}, {"bench-iters", "10"}};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k.rfind("--", 0) == 0) a[k.substr(2)] = argv[i + 1];
  }
  return a;
}

bool expect(bool ok, const std::string& what) {
  if (!ok) std::cout << "MISMATCH: " << what << std::endl;
  return ok;
}

// Every rank r contributes r + 1 + i at position i, so every reduction has a closed form.
int check(ProcessGroup& pg) {
  const int r = pg.rank(), n = pg.size();
  bool ok = true;
  const int64_t len = 1000;
  Tensor x = arange(0, double(len), 1.0, {DType::f32}).add_(full({len}, double(r + 1)));
  pg.allreduce(x, ReduceOp::Sum)->wait();
  const auto v = x.to_vector<float>();
  for (int64_t i = 0; i < len; ++i)
    ok &= expect(v[size_t(i)] == float(n * i + n * (n + 1) / 2), "allreduce sum at " + std::to_string(i));
  Tensor m = full({7}, double(r), {DType::i64});
  pg.allreduce(m, ReduceOp::Max)->wait();
  ok &= expect(m.to_vector<int64_t>()[6] == n - 1, "allreduce max");
  Tensor b = full({5}, r == n - 1 ? 42.0 : -1.0, {DType::f64});
  pg.broadcast(b, n - 1)->wait();
  ok &= expect(b.to_vector<double>()[4] == 42.0, "broadcast");
  const auto parts = pg.allgather(full({r + 1, 2}, double(r), {DType::i32}));
  ok &= expect(int(parts.size()) == n, "allgather count");
  for (int q = 0; q < n && ok; ++q)
    ok &= expect(parts[size_t(q)].size(0) == q + 1 && parts[size_t(q)].to_vector<int32_t>()[0] == q, "allgather part");
  const auto blobs = pg.allgather_bytes(Bytes(size_t(r), uint8_t(r)));
  for (int q = 0; q < n; ++q) ok &= expect(blobs[size_t(q)] == Bytes(size_t(q), uint8_t(q)), "allgather_bytes");
  pg.barrier();
  return ok ? 0 : 1;
}

int bench(ProcessGroup& pg, int iters) {
  for (int64_t bytes : {int64_t(25) * 1000 * 1000, int64_t(64) << 20}) {
    Tensor x = ones({bytes / 4});
    pg.allreduce(x)->wait();  // warm up
    pg.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) pg.allreduce(x)->wait();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
    if (pg.rank() == 0) std::cout << "allreduce " << bytes << " bytes f32: " << ms << " ms" << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto a = parse(argc, argv);
  const int rank = std::stoi(a["rank"]), size = std::stoi(a["size"]), victim = std::stoi(a["victim"]);
  const std::string scenario = a["scenario"];
  const auto timeout = std::chrono::milliseconds(std::stoi(a["timeout-ms"]));
  try {
    // --serve-store 1: this rank also hosts the store (for running the program by hand).
    auto store = std::make_shared<TcpStore>(a["host"], std::stoi(a["port"]), a["serve-store"] == "1", timeout);
    ProcessGroupOptions opt;
    opt.timeout = timeout;
    auto pg = new_process_group(store, rank, size, a["backend"], opt);
    int rc = 0;
    if (scenario == "check") {
      rc = check(*pg);
    } else if (scenario == "bench") {
      rc = bench(*pg, std::stoi(a["bench-iters"]));
    } else {
      // Failure scenarios: everyone warms up together, then the victim goes away.
      Tensor x = ones({1 << 16});
      pg->allreduce(x)->wait();
      if (rank == victim) {
        if (scenario == "die_before_allreduce") std::_Exit(0);
        if (scenario == "kill_before_allreduce" || scenario == "kill_before_allgather_into") raise(SIGKILL);
        if (scenario == "hang_before_allreduce") std::this_thread::sleep_for(std::chrono::hours(1));
      }
      if (scenario == "kill_before_allgather_into") {
        Tensor out = zeros({size * x.numel()});
        pg->allgather_into(out, x)->wait();
        std::cout << "UNEXPECTED: allgather_into succeeded" << std::endl;
        return 1;
      }
      pg->allreduce(x)->wait();
      std::cout << "UNEXPECTED: allreduce succeeded" << std::endl;
      return 1;
    }
    if (rc == 0) std::cout << "OK" << std::endl;
    return rc;
  } catch (const Error& e) {
    std::cout << "ERROR: " << e.what() << std::endl;
    return 3;
  }
}
