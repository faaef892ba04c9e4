// A separate process for the store and rendezvous tests. Modes:
//   store_client exchange HOST PORT RANK WORLD TIMEOUT_MS
//       connects to the store, publishes "value/RANK", bumps "counter", reads every rank's value
//       and waits for all of them; prints "rank R ok".
//   store_client serve HOST TIMEOUT_MS
//       serves a store on a free port, prints the port, then blocks in a get that nobody answers
//       (the test kills it to make the store vanish).
//   store_client rendezvous TIMEOUT_MS
//       env:// rendezvous from RANK, WORLD_SIZE, ... then a small exchange through the store;
//       prints "rank R of W local L node N ok".
// Any ember::Error is printed to stderr and the exit code is 1.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "core/error.h"
#include "distributed/rendezvous.h"
#include "distributed/tcp_store.h"

using namespace ember::distributed;

namespace {

std::chrono::milliseconds ms(const char* text) { return std::chrono::milliseconds(std::atoll(text)); }

int exchange(const std::string& host, int port, int rank, int world, std::chrono::milliseconds timeout) {
  TcpStore store(host, port, false, timeout);
  store.set_string("value/" + std::to_string(rank), "v" + std::to_string(rank));
  store.add("counter", 1);
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) {
    std::string key = "value/" + std::to_string(r);
    std::string v = store.get_string(key);
    if (v != std::string("v").append(std::to_string(r))) {  // not "v" + ...: a gcc 12 -Wrestrict false alarm
      std::cerr << "rank " << rank << ": " << key << " = '" << v << "'\n";
      return 1;
    }
    keys.push_back(key);
  }
  store.wait(keys);
  if (!store.check(keys)) return 1;
  std::cout << "rank " << rank << " ok" << std::endl;
  return 0;
}

int serve(const std::string& host, std::chrono::milliseconds timeout) {
  TcpStore store(host, 0, true, timeout);
  std::cout << store.port() << std::endl;
  store.get("never-set");
  return 0;
}

int rendezvous_mode(std::chrono::milliseconds timeout) {
  RendezvousInfo info = rendezvous_info_from_env();
  std::shared_ptr<Store> store = rendezvous(info, timeout);
  store->set_string("hello/" + std::to_string(info.rank), std::to_string(info.rank * 10));
  for (int r = 0; r < info.world_size; ++r) {
    std::string v = store->get_string("hello/" + std::to_string(r));
    if (v != std::to_string(r * 10)) {
      std::cerr << "rank " << info.rank << " read '" << v << "' from rank " << r << "\n";
      return 1;
    }
  }
  // Rank 0 hosts the store, so it leaves last: only after every other rank has said it is done
  // (a barrier alone would let rank 0 exit while the others still await its reply).
  rendezvous_barrier(*store, info.rank, info.world_size, timeout, "test/done");
  if (info.rank == 0) {
    std::vector<std::string> left;
    for (int r = 1; r < info.world_size; ++r) left.push_back("test/left/" + std::to_string(r));
    store->wait(left);
  } else {
    store->set_string("test/left/" + std::to_string(info.rank), "1");
  }
  std::cout << "rank " << info.rank << " of " << info.world_size << " local " << info.local_rank << " node "
            << info.node_rank() << " ok" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "exchange" && argc == 7)
      return exchange(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]), ms(argv[6]));
    if (mode == "serve" && argc == 4) return serve(argv[2], ms(argv[3]));
    if (mode == "rendezvous" && argc == 3) return rendezvous_mode(ms(argv[2]));
    std::cerr << "usage: store_client exchange HOST PORT RANK WORLD TIMEOUT_MS | serve HOST TIMEOUT_MS | "
                 "rendezvous TIMEOUT_MS\n";
    return 2;
  } catch (const ember::Error& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
}
