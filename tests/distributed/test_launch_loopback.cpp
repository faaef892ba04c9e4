// `ember launch` with every loopback spelling of the main machine: 127.0.1.1 (the address
// Debian gives the host name), this machine's host name, and, in a private mount and UTS
// namespace whose /etc/hosts is laid out as Debian's, a host name that resolves to 127.0.1.1
// only and a "localhost" that resolves to ::1 first. Each job is two ranks of
// tests/programs/rendezvous_allreduce that meet through rank 0's store and all-reduce over Gloo.
// tests/programs/loopback_probe shows how names resolve inside that namespace.
#include <unistd.h>

#include <chrono>
#include <climits>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "distributed/socket_util.h"
#include "process_test_util.h"
#include "test_util.h"

namespace ember::distributed {
namespace {

using Clock = std::chrono::steady_clock;
using ember::testing::env_or;
using ember::testing::free_port;

// A launch must finish well within this; rendezvous_allreduce itself gives up after 20 s.
constexpr auto kDeadline = std::chrono::seconds(45);
constexpr double kBoundSeconds = 30;
constexpr const char* kDebianHostName = "ember-debian-host";

std::string ember_cli() { return env_or("EMBER_CLI", EMBER_CLI); }
std::string program(const char* name) { return env_or("EMBER_TEST_PROGRAMS", EMBER_TEST_PROGRAMS) + "/" + name; }

// Debian 12's /etc/hosts for a machine called ember-debian-host, with the IPv6 line first so
// that "localhost" resolves to ::1 before 127.0.0.1.
const char* kDebianHosts =
    "::1\tlocalhost ip6-localhost ip6-loopback\n"
    "127.0.0.1\tlocalhost\n"
    "127.0.1.1\tember-debian-host.example.org\tember-debian-host\n";

// Inside the namespace: the hosts file over /etc/hosts, the host name set, then the command.
// With IP "HOSTNAME" the launcher is given `$(hostname)`, as a user would type it.
const char* kNamespaceScript =
    "mount --bind \"$0\" /etc/hosts || exit 90\n"
    "hostname ember-debian-host || exit 91\n"
    "cmd=$1; ip=$2; shift 2\n"
    "if [ \"$ip\" = HOSTNAME ]; then ip=$(hostname); fi\n"
    "if [ \"$cmd\" = launch ]; then exec \"$EMBER_CLI_UNDER_TEST\" launch --main_process_ip \"$ip\" \"$@\"; fi\n"
    "exec \"$@\"\n";

struct Outcome {
  int exit_code = -1;  // -1: killed at the deadline or by a signal
  std::string output;
  double seconds = 0;
};

std::optional<std::string> find_unshare() {
  for (const char* p : {"/usr/bin/unshare", "/bin/unshare"})
    if (std::filesystem::exists(p)) return std::string(p);
  return std::nullopt;
}

class LaunchLoopback : public ::testing::Test {
 protected:
  // Runs `args` with the job's variables cleared and no launch config file, output to a log.
  Outcome run(const std::vector<std::string>& args, const std::map<std::string, std::string>& extra = {}) {
    std::map<std::string, std::optional<std::string>> env;
    for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                          "GROUP_RANK", "EMBER_STORE_BIND_ADDR", "EMBER_GLOO_IFNAME", "EMBER_GLOO_HOSTNAME"})
      env[v] = std::nullopt;
    env["EMBER_CONFIG_FILE"] = dir_.file("no_config.yaml");
    for (const auto& [k, v] : extra) env[k] = v;
    const std::string log = dir_.file("run" + std::to_string(runs_++) + ".log");
    const auto start = Clock::now();
    const pid_t pid = ember::testing::spawn_logged(args, log, ember::testing::environment_with(env));
    const auto reaped = ember::testing::reap_all({pid}, kDeadline)[0];
    Outcome r;
    r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (!reaped.killed && WIFEXITED(reaped.status)) r.exit_code = WEXITSTATUS(reaped.status);
    r.output = (reaped.killed ? "(killed at the deadline)\n" : "") + ember::testing::read_text_file(log);
    return r;
  }

  std::vector<std::string> launch_args(const std::string& ip) {
    return {"--main_process_ip", ip, "--num_processes", "2", "--main_process_port", std::to_string(free_port()),
            "--cpu", program("rendezvous_allreduce"), "20000"};
  }

  Outcome launch(const std::string& ip) {
    std::vector<std::string> args = {ember_cli(), "launch"};
    for (auto& a : launch_args(ip)) args.push_back(a);
    return run(args);
  }

  // Runs in a mount + UTS namespace with Debian's hosts file; `ip` for a launch ("HOSTNAME":
  // the namespace's `$(hostname)`), or a plain command when `ip` is empty.
  Outcome in_debian_namespace(const std::string& ip, const std::vector<std::string>& rest) {
    const std::string hosts = dir_.write("hosts", kDebianHosts);
    std::vector<std::string> args = {*find_unshare(), "--mount", "--uts", "sh", "-c", kNamespaceScript, hosts,
                                     ip.empty() ? "command" : "launch", ip.empty() ? "-" : ip};
    for (auto& a : rest) args.push_back(a);
    return run(args, {{"EMBER_CLI_UNDER_TEST", ember_cli()}});
  }

  // Skips unless this machine lets a test build the namespace (root and util-linux).
  bool debian_namespace_available(std::string& why) {
    if (::geteuid() != 0) {
      why = "a private mount namespace needs root";
      return false;
    }
    if (!find_unshare()) {
      why = "util-linux's `unshare` is not installed";
      return false;
    }
    Outcome probe = in_debian_namespace("", {"/bin/sh", "-c", "hostname"});
    if (probe.exit_code != 0 || probe.output.find(kDebianHostName) == std::string::npos) {
      why = "cannot build a mount + UTS namespace here: " + probe.output;
      return false;
    }
    return true;
  }

  void expect_two_ranks_met(const Outcome& r, const std::string& ip) {
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_LT(r.seconds, kBoundSeconds) << r.output;
    for (int rank = 0; rank < 2; ++rank) {
      const std::string line = "rank " + std::to_string(rank) + " of 2: allreduce ok via MASTER_ADDR=" + ip;
      EXPECT_NE(r.output.find(line), std::string::npos) << "missing \"" << line << "\" in:\n" << r.output;
    }
  }

  ember::testing::TempDir dir_{"launch_loopback"};
  int runs_ = 0;
};

TEST_F(LaunchLoopback, TwoRanksMeetAt127_0_1_1) {
  // All of 127.0.0.0/8 is loopback on Linux, mapped in /etc/hosts or not.
  expect_two_ranks_met(launch("127.0.1.1"), "127.0.1.1");
}

TEST_F(LaunchLoopback, TwoRanksMeetAtThisMachinesHostName) {
  char name[HOST_NAME_MAX + 1] = {};
  ASSERT_EQ(::gethostname(name, sizeof(name)), 0);
  const std::string host = name;
  // Whatever the name resolves to here (loopback on a laptop or Debian, the machine's own
  // address on a server), `ember launch --main_process_ip $(hostname)` has to work.
  if (net::resolve_addresses(host).empty())
    GTEST_SKIP() << "this machine's host name '" << host << "' does not resolve";
  expect_two_ranks_met(launch(host), host);
}

TEST_F(LaunchLoopback, TwoRanksMeetAtADebianHostName) {
  std::string why;
  if (!debian_namespace_available(why)) GTEST_SKIP() << why;
  std::vector<std::string> rest = launch_args("ignored");
  rest.erase(rest.begin(), rest.begin() + 2);  // the script passes --main_process_ip
  expect_two_ranks_met(in_debian_namespace("HOSTNAME", rest), kDebianHostName);
}

TEST_F(LaunchLoopback, TwoRanksMeetAtLocalhostResolvingToIpv6First) {
  std::string why;
  if (!debian_namespace_available(why)) GTEST_SKIP() << why;
  std::vector<std::string> rest = launch_args("ignored");
  rest.erase(rest.begin(), rest.begin() + 2);
  expect_two_ranks_met(in_debian_namespace("localhost", rest), "localhost");
}

TEST_F(LaunchLoopback, NamesResolveAsOnDebian) {
  std::string why;
  if (!debian_namespace_available(why)) GTEST_SKIP() << why;
  Outcome r = in_debian_namespace("", {program("loopback_probe"), kDebianHostName, "localhost", "127.0.1.1", "::1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // One probe line as key -> value.
  auto fields_of = [&](const std::string& name) {
    std::map<std::string, std::string> fields;
    const size_t at = r.output.find(name + " loopback=");
    if (at == std::string::npos) return fields;
    std::istringstream line(r.output.substr(at + name.size(), r.output.find('\n', at) - at - name.size()));
    for (std::string field; line >> field;) {
      const size_t eq = field.find('=');
      if (eq != std::string::npos) fields[field.substr(0, eq)] = field.substr(eq + 1);
    }
    return fields;
  };
  using Fields = std::map<std::string, std::string>;
  // The host name is loopback here only: one machine serves it where it resolves, a job over
  // several machines serves every interface (the others know the name by its real address).
  EXPECT_EQ(fields_of(kDebianHostName), (Fields{{"loopback", "1"},
                                                {"everywhere", "0"},
                                                {"addresses", "127.0.1.1"},
                                                {"bind_one_machine", kDebianHostName},
                                                {"bind_two_machines", "0.0.0.0"},
                                                {"listeners", "1"}}))
      << r.output;
  EXPECT_EQ(fields_of("127.0.1.1"), (Fields{{"loopback", "1"},
                                            {"everywhere", "1"},
                                            {"addresses", "127.0.1.1"},
                                            {"bind_one_machine", "127.0.1.1"},
                                            {"bind_two_machines", "127.0.1.1"},
                                            {"listeners", "1"}}))
      << r.output;
  Fields v6 = fields_of("::1");
  EXPECT_EQ(v6.count("loopback") ? v6.at("loopback") + v6.at("everywhere") + v6.at("bind_one_machine") : "", "11::1")
      << r.output;
  // "localhost" is loopback everywhere, and its store listens on every address it resolves to
  // (::1 too, where this machine has IPv6).
  Fields localhost = fields_of("localhost");
  EXPECT_TRUE(localhost["addresses"] == "::1,127.0.0.1" || localhost["addresses"] == "127.0.0.1,::1") << r.output;
  EXPECT_EQ(localhost["everywhere"], "1") << r.output;
  EXPECT_EQ(localhost["bind_one_machine"], "localhost") << r.output;
  EXPECT_EQ(localhost["bind_two_machines"], "localhost") << r.output;
  EXPECT_EQ(localhost["listeners"], v6["listeners"] == "1" ? "2" : "1") << r.output;
}

}  // namespace
}  // namespace ember::distributed
