// env:// rendezvous: parsing the launcher's variables, choosing the store's bind address, and
// the startup barrier across threads and real processes.
#include <unistd.h>

#include <cstdlib>
#include <future>
#include <map>
#include <thread>

#include "distributed/rendezvous.h"
#include "distributed/socket_util.h"
#include "distributed/tcp_store.h"
#include "process_test_util.h"
#include "store_child_process.h"
#include "test_util.h"

namespace ember::distributed {
namespace {

using namespace std::chrono_literals;
using Env = std::map<std::string, std::string>;
using EnvVars = std::map<std::string, std::optional<std::string>>;
using ember::testing::ChildProcess;

RendezvousInfo parse(const Env& env) {
  return rendezvous_info_from([&](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

Env full_env(int rank, int world, int port = 29500) {
  return {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}, {"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world)}, {"LOCAL_RANK", std::to_string(rank)},
          {"LOCAL_WORLD_SIZE", std::to_string(world)}};
}

using ember::testing::free_port;

// Sets (or unsets) environment variables for one scope, restoring the old values after.
class ScopedEnv {
 public:
  explicit ScopedEnv(const EnvVars& vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      if (value) setenv(name.c_str(), value->c_str(), 1);
      else unsetenv(name.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) setenv(name.c_str(), value->c_str(), 1);
      else unsetenv(name.c_str());
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

const std::map<std::string, std::optional<std::string>> kNoRendezvousVars = {
    {"MASTER_ADDR", std::nullopt}, {"MASTER_PORT", std::nullopt},      {"RANK", std::nullopt},
    {"WORLD_SIZE", std::nullopt},  {"LOCAL_RANK", std::nullopt},       {"LOCAL_WORLD_SIZE", std::nullopt},
    {"EMBER_STORE_BIND_ADDR", std::nullopt}};

// ---- parsing

TEST(RendezvousEnv, NothingSetMeansOneProcess) {
  RendezvousInfo info = parse({});
  EXPECT_EQ(info.master_addr, "127.0.0.1");
  EXPECT_EQ(info.master_port, 0);
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.local_world_size, 1);
  EXPECT_EQ(info.node_rank(), 0);
  EXPECT_EQ(info.num_nodes(), 1);
}

TEST(RendezvousEnv, ReadsTheProcessEnvironment) {
  auto vars = kNoRendezvousVars;
  ScopedEnv clean(vars);
  EXPECT_EQ(rendezvous_info_from_env().world_size, 1);
  ScopedEnv set(EnvVars{{"MASTER_ADDR", "node0"}, {"MASTER_PORT", "1234"}, {"RANK", "5"}, {"WORLD_SIZE", "8"},
                 {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}});
  RendezvousInfo info = rendezvous_info_from_env();
  EXPECT_EQ(info.master_addr, "node0");
  EXPECT_EQ(info.master_port, 1234);
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(info.node_rank(), 1);
  EXPECT_EQ(info.num_nodes(), 2);
}

TEST(RendezvousEnv, LocalVariablesDefaultToOneMachine) {
  RendezvousInfo info = parse({{"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "29500"}, {"RANK", "2"},
                               {"WORLD_SIZE", "3"}});
  EXPECT_EQ(info.local_rank, 2);
  EXPECT_EQ(info.local_world_size, 3);
  EXPECT_EQ(info.node_rank(), 0);
  // A single process needs no master address or port.
  RendezvousInfo single = parse({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  EXPECT_EQ(single.master_port, 0);
}

TEST(RendezvousEnv, HalfSetPairsNameTheMissingVariable) {
  EXPECT_EMBER_ERROR(parse({{"RANK", "1"}}), "RANK='1' is set but WORLD_SIZE is not");
  EXPECT_EMBER_ERROR(parse({{"WORLD_SIZE", "2"}}), "WORLD_SIZE='2' is set but RANK is not");
  Env env = full_env(0, 2);
  env.erase("LOCAL_WORLD_SIZE");
  EXPECT_EMBER_ERROR(parse(env), "LOCAL_RANK='0' is set but LOCAL_WORLD_SIZE is not");
  EXPECT_EMBER_ERROR(parse({{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1"}}), "RANK and WORLD_SIZE are not");
  env = full_env(1, 2);
  env.erase("MASTER_ADDR");
  EXPECT_EMBER_ERROR(parse(env), "WORLD_SIZE=2 but MASTER_ADDR is not set");
  env = full_env(1, 2);
  env.erase("MASTER_PORT");
  EXPECT_EMBER_ERROR(parse(env), "WORLD_SIZE=2 but MASTER_PORT is not set");
}

TEST(RendezvousEnv, MalformedValuesNameTheVariableAndValue) {
  auto with = [](const std::string& name, const std::string& value) {
    Env env = full_env(1, 4);
    env[name] = value;
    return env;
  };
  EXPECT_EMBER_ERROR(parse(with("RANK", "one")), "RANK='one' is not an integer");
  EXPECT_EMBER_ERROR(parse(with("RANK", "")), "RANK='' is not an integer");
  EXPECT_EMBER_ERROR(parse(with("WORLD_SIZE", "4 ")), "WORLD_SIZE='4 ' is not an integer");
  EXPECT_EMBER_ERROR(parse(with("WORLD_SIZE", "99999999999")), "WORLD_SIZE='99999999999' is not an integer");
  EXPECT_EMBER_ERROR(parse(with("LOCAL_RANK", "-")), "LOCAL_RANK='-' is not an integer");
  EXPECT_EMBER_ERROR(parse(with("MASTER_PORT", "http")), "MASTER_PORT='http' is not an integer");
  EXPECT_EMBER_ERROR(parse(with("MASTER_PORT", "70000")), "MASTER_PORT='70000' is not a port number");
  EXPECT_EMBER_ERROR(parse(with("MASTER_PORT", "0")), "MASTER_PORT='0' is not a port number");
  EXPECT_EMBER_ERROR(parse(with("MASTER_ADDR", "")), "MASTER_ADDR is set but empty");
}

TEST(RendezvousEnv, InconsistentValuesAreErrors) {
  EXPECT_EMBER_ERROR(parse(full_env(2, 2)), "RANK='2' is out of range for WORLD_SIZE=2 (0..1)");
  EXPECT_EMBER_ERROR(parse(full_env(-1, 2)), "RANK='-1' is out of range");
  EXPECT_EMBER_ERROR(parse(full_env(0, 0)), "WORLD_SIZE='0' must be at least 1");
  Env env = full_env(1, 4);
  env["LOCAL_RANK"] = "2";
  env["LOCAL_WORLD_SIZE"] = "2";
  EXPECT_EMBER_ERROR(parse(env), "LOCAL_RANK='2' is out of range for LOCAL_WORLD_SIZE=2");
  env["LOCAL_RANK"] = "0";
  env["LOCAL_WORLD_SIZE"] = "8";
  EXPECT_EMBER_ERROR(parse(env), "LOCAL_WORLD_SIZE='8' must be in 1..WORLD_SIZE=4");
}

// ---- bind address

TEST(RendezvousStore, BindsWhereTheRanksDial) {
  auto vars = kNoRendezvousVars;
  ScopedEnv clean(vars);
  RendezvousInfo one_machine;
  one_machine.world_size = one_machine.local_world_size = 2;
  RendezvousInfo two_machines = one_machine;
  two_machines.world_size = 4;
  // A loopback master is served on exactly the addresses the ranks dial, nothing wider: binding
  // 127.0.0.1 for a master of 127.0.1.1 (Debian's host name) would refuse every rank.
  for (const char* loopback : {"127.0.0.1", "127.0.1.1", "127.0.0.2", "::1", "localhost"}) {
    for (RendezvousInfo* info : {&one_machine, &two_machines}) {
      info->master_addr = loopback;
      EXPECT_EQ(store_bind_address(*info), loopback) << loopback << " on " << info->num_nodes() << " machine(s)";
    }
  }
  for (RendezvousInfo* info : {&one_machine, &two_machines}) {
    info->master_addr = "10.1.2.3";
    EXPECT_EQ(store_bind_address(*info), "0.0.0.0");
    info->master_addr = "2001:db8::1";
    EXPECT_EQ(store_bind_address(*info), "::");
  }
  ScopedEnv bind(EnvVars{{"EMBER_STORE_BIND_ADDR", "10.9.8.7"}});
  EXPECT_EQ(store_bind_address(one_machine), "10.9.8.7");
}

TEST(RendezvousStore, ThisMachinesHostNameIsServedWhereItResolves) {
  auto vars = kNoRendezvousVars;
  ScopedEnv clean(vars);
  char name[256] = {};
  ASSERT_EQ(::gethostname(name, sizeof(name) - 1), 0);
  if (!net::is_loopback_host(name)) GTEST_SKIP() << "the host name '" << name << "' is not loopback here";
  RendezvousInfo info;
  info.master_addr = name;
  info.world_size = info.local_world_size = 2;
  EXPECT_EQ(store_bind_address(info), name);
  // On several machines the others may know the name by a routable address.
  info.world_size = 4;
  EXPECT_EQ(store_bind_address(info), "0.0.0.0");
}

TEST(RendezvousStore, RanksMeetAt127_0_1_1) {
  int port = free_port();
  Env env0 = full_env(0, 2, port), env1 = full_env(1, 2, port);
  env0["MASTER_ADDR"] = env1["MASTER_ADDR"] = "127.0.1.1";
  auto rank1 = std::async(std::launch::async, [&] { return rendezvous(parse(env1), 10s); });
  std::shared_ptr<Store> store0 = rendezvous(parse(env0), 10s);
  ASSERT_EQ(rank1.wait_for(15s), std::future_status::ready);
  std::shared_ptr<Store> store1 = rank1.get();
  EXPECT_EQ(dynamic_cast<TcpStore&>(*store0).host(), "127.0.1.1");
  store1->set_string("from1", "x");
  EXPECT_EQ(store0->get_string("from1"), "x");
}

TEST(RendezvousStore, ARefusedDialSaysSoWithinSeconds) {
  // Rank 1 of 2 with nobody serving the store: while it waits it says what it dials and
  // why it still waits, keeps retrying, and at its timeout fails naming address, rank and time.
  const int port = free_port();
  const std::string where = "127.0.1.1:" + std::to_string(port);
  auto env = kNoRendezvousVars;
  for (auto& [name, value] : full_env(1, 2, port)) env[name] = value;
  env["MASTER_ADDR"] = "127.0.1.1";
  const auto start = std::chrono::steady_clock::now();
  ChildProcess rank1({std::string(EMBER_TEST_PROGRAMS) + "/store_client", "rendezvous", "7000"}, env);
  std::optional<std::string> notice;
  while (!notice || notice->find("still dialling") == std::string::npos) {
    notice = rank1.read_line(8s);
    if (!notice) break;
  }
  ASSERT_TRUE(notice) << "no notice while dialling; output: " << rank1.output();
  for (const std::string& part : {"TcpStore: rank 1 is still dialling the store at " + where + " after ",
                                  std::string("Connection refused"), std::string("is rank 0"),
                                  std::string("retrying until the timeout of 7s")})
    EXPECT_NE(notice->find(part), std::string::npos) << "\"" << part << "\" not in: " << *notice;

  EXPECT_EQ(rank1.wait(15s), 1) << rank1.output();
  EXPECT_GE(std::chrono::steady_clock::now() - start, 7s) << "it gave up before its timeout";
  // The notice comes while rank 1 still dials: before the timeout's error, not with it.
  const size_t failed = rank1.output().find("TcpStore: rank 1 could not connect to the store at " + where +
                                            " within 7s: Connection refused");
  ASSERT_NE(failed, std::string::npos) << rank1.output();
  EXPECT_LT(rank1.output().find("is still dialling"), failed) << rank1.output();
}

// ---- connecting and the barrier

TEST(RendezvousStore, SingleProcessNeedsNoEnvironment) {
  auto vars = kNoRendezvousVars;
  ScopedEnv clean(vars);
  std::shared_ptr<Store> store = rendezvous(rendezvous_info_from_env(), 2s);
  auto* tcp = dynamic_cast<TcpStore*>(store.get());
  ASSERT_NE(tcp, nullptr);
  EXPECT_TRUE(tcp->is_server());
  EXPECT_EQ(tcp->host(), "127.0.0.1");
  EXPECT_GT(tcp->port(), 0);
  store->set_string("k", "v");
  EXPECT_EQ(store->get_string("k"), "v");
  EXPECT_EQ(store->get_string("ember/rendezvous"), "1");
}

TEST(RendezvousStore, RanksMeetAcrossThreads) {
  constexpr int kWorld = 3;
  int port = free_port();
  std::vector<std::future<std::shared_ptr<Store>>> ranks;
  for (int r = 0; r < kWorld; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r] { return rendezvous(parse(full_env(r, kWorld, port)), 10s); }));
  std::vector<std::shared_ptr<Store>> stores;
  for (auto& f : ranks) {
    ASSERT_EQ(f.wait_for(20s), std::future_status::ready);
    stores.push_back(f.get());
  }
  EXPECT_TRUE(dynamic_cast<TcpStore&>(*stores[0]).is_server());
  EXPECT_FALSE(dynamic_cast<TcpStore&>(*stores[1]).is_server());
  EXPECT_EQ(stores[2]->add("ember/rendezvous", 0), kWorld);
  stores[1]->set_string("from1", "x");
  EXPECT_EQ(stores[2]->get_string("from1"), "x");
}

TEST(RendezvousStore, MissingRankIsNamed) {
  int port = free_port();
  EXPECT_EMBER_ERROR(rendezvous(parse(full_env(0, 2, port)), 300ms),
                     "rendezvous: only 1 of 2 ranks arrived within 0.3s (missing ranks: 1)");
}

TEST(RendezvousStore, MissingRanksAreListed) {
  TcpStore store("127.0.0.1", 0, true, 2s);
  auto rank2 = std::async(std::launch::async, [&] {
    TcpStore client("127.0.0.1", store.port(), false, 2s);
    rendezvous_barrier(client, 2, 4, 1s);
  });
  // Ranks 0 and 2 arrive well within the second each waits; 1 and 3 never do.
  EXPECT_EMBER_ERROR(rendezvous_barrier(store, 0, 4, 1s), "only 2 of 4 ranks arrived within 1s",
                     "(missing ranks: 1, 3)");
  ASSERT_EQ(rank2.wait_for(10s), std::future_status::ready);
  EXPECT_EMBER_ERROR(rank2.get(), "missing ranks: 1, 3");
  // The barrier restores the store's own timeout.
  EXPECT_EQ(store.timeout(), 2s);
}

TEST(RendezvousStore, NonZeroRankWithoutAServerFailsToConnect) {
  int port = free_port();
  EXPECT_EMBER_ERROR(rendezvous(parse(full_env(1, 2, port)), 300ms),
                     "TcpStore: rank 1 could not connect to the store at 127.0.0.1:" + std::to_string(port),
                     "within 0.3s", "Connection refused", "is rank 0");
}

TEST(RendezvousStore, BusyMasterPortIsAClearError) {
  TcpStore other("127.0.0.1", 0, true, 2s);
  EXPECT_EMBER_ERROR(connect_store(parse(full_env(0, 2, other.port())), 1s), "is already in use",
                     "set MASTER_PORT");
}

TEST(RendezvousStore, RankZeroSaysWhichRanksItStillWaitsFor) {
  const int port = free_port();
  auto env = kNoRendezvousVars;
  for (auto& [name, value] : full_env(0, 3, port)) env[name] = value;
  ChildProcess rank0({std::string(EMBER_TEST_PROGRAMS) + "/store_client", "rendezvous", "6500"}, env);
  std::optional<std::string> notice;
  while (!notice || notice->find("rendezvous: rank 0 has waited") == std::string::npos) {
    notice = rank0.read_line(8s);
    if (!notice) break;
  }
  ASSERT_TRUE(notice) << "rank 0 said nothing while waiting; output: " << rank0.output();
  EXPECT_NE(notice->find("for ranks 1, 2 (1 of 3 arrived); waiting until the timeout of 6.5s"), std::string::npos)
      << *notice;
  EXPECT_EQ(rank0.wait(15s), 1) << rank0.output();
  // The notice comes while rank 0 still waits: before the timeout's error, not with it.
  const std::string output = rank0.output();
  const size_t waiting = output.find("rendezvous: rank 0 has waited");
  const size_t failed = output.find("only 1 of 3 ranks arrived within 6.5s (missing ranks: 1, 2)");
  ASSERT_NE(failed, std::string::npos) << output;
  EXPECT_LT(waiting, failed) << output;
}

TEST(RendezvousStore, RanksMeetAcrossProcesses) {
  constexpr int kWorld = 3;
  int port = free_port();
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int r = 0; r < kWorld; ++r) {
    std::map<std::string, std::optional<std::string>> env = kNoRendezvousVars;
    // Two machines' worth of local ranks: ranks 0 and 1 on node 0, rank 2 on node 1.
    for (auto& [name, value] : full_env(r, kWorld, port)) env[name] = value;
    env["LOCAL_WORLD_SIZE"] = "2";
    env["LOCAL_RANK"] = std::to_string(r % 2);
    ranks.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{std::string(EMBER_TEST_PROGRAMS) + "/store_client", "rendezvous", "20000"}, env));
  }
  for (int r = 0; r < kWorld; ++r) {
    int code = ranks[r]->wait(30s);
    EXPECT_EQ(code, 0) << "rank " << r << " output: " << ranks[r]->output();
    std::string expected = "rank " + std::to_string(r) + " of 3 local " + std::to_string(r % 2) + " node " +
                           std::to_string(r / 2) + " ok";
    EXPECT_NE(ranks[r]->output().find(expected), std::string::npos) << ranks[r]->output();
  }
}

}  // namespace
}  // namespace ember::distributed
