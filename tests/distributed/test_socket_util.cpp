// The address rules the store, the rendezvous and the Gloo group share: which hosts are
// loopback, what names resolve to, listening on every address of a name, and what a dial
// that keeps failing reports.
#include <unistd.h>

#include <climits>

#include "distributed/socket_util.h"
#include "process_test_util.h"
#include "test_util.h"

namespace ember::distributed::net {
namespace {

using namespace std::chrono_literals;

TEST(LoopbackHost, AddressLiterals) {
  for (const char* host : {"127.0.0.1", "127.0.1.1", "127.0.0.2", "127.255.255.254", "127.1", "::1",
                           "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1", "::ffff:127.0.1.1"}) {
    EXPECT_TRUE(is_loopback_host(host)) << host;
    EXPECT_TRUE(is_loopback_everywhere(host)) << host;
  }
  for (const char* host : {"10.0.0.1", "126.255.255.255", "128.0.0.1", "0.0.0.0", "192.0.2.1", "::", "::2",
                           "fe80::1", "::ffff:10.0.0.1", "2001:db8::1"}) {
    EXPECT_FALSE(is_loopback_host(host)) << host;
    EXPECT_FALSE(is_loopback_everywhere(host)) << host;
  }
}

TEST(LoopbackHost, LocalhostInAnySpelling) {
  for (const char* host : {"localhost", "LocalHost", "LOCALHOST", "localhost."}) {
    EXPECT_TRUE(is_loopback_host(host)) << host;
    EXPECT_TRUE(is_loopback_everywhere(host)) << host;
  }
  EXPECT_FALSE(is_loopback_host("localhostx"));
  EXPECT_FALSE(is_loopback_everywhere("my.localhost.example"));
}

TEST(LoopbackHost, EmptyAndUnresolvableNamesAreNotLoopback) {
  EXPECT_FALSE(is_loopback_host(""));
  EXPECT_FALSE(is_loopback_everywhere(""));
  // .invalid never resolves (RFC 6761).
  EXPECT_FALSE(is_loopback_host("no-such-host.invalid"));
  EXPECT_TRUE(resolve_addresses("no-such-host.invalid").empty());
}

TEST(LoopbackHost, HostNamesFollowWhatTheyResolveTo) {
  char name[HOST_NAME_MAX + 1] = {};
  ASSERT_EQ(::gethostname(name, sizeof(name)), 0);
  const std::vector<std::string> addresses = resolve_addresses(name);
  if (addresses.empty()) GTEST_SKIP() << "this machine's host name '" << name << "' does not resolve";
  bool all_loopback = true;
  for (const auto& a : addresses) all_loopback = all_loopback && is_loopback_everywhere(a);
  EXPECT_EQ(is_loopback_host(name), all_loopback) << name;
  // A name is never loopback on every machine: another one may resolve it elsewhere.
  EXPECT_FALSE(is_loopback_everywhere(name)) << name;
}

TEST(ResolveAddresses, LiteralsResolveToThemselves) {
  EXPECT_EQ(resolve_addresses("127.0.1.1"), std::vector<std::string>{"127.0.1.1"});
  EXPECT_EQ(resolve_addresses("::1"), std::vector<std::string>{"::1"});
  const auto local = resolve_addresses("localhost");
  ASSERT_FALSE(local.empty());
  for (const auto& a : local) EXPECT_TRUE(is_loopback_everywhere(a)) << a;
}

TEST(ListenOn, EveryAddressOfANameOnOnePort) {
  std::vector<Fd> fds = listen_on("localhost", 0);
  ASSERT_FALSE(fds.empty());
  const int port = local_port(fds[0].get());
  for (const Fd& fd : fds) EXPECT_EQ(local_port(fd.get()), port);
  // Each address localhost resolves to accepts, so a client reaches the store whichever it tries.
  size_t reached = 0;
  for (const std::string& a : resolve_addresses("localhost")) {
    std::string error;
    Fd c = connect_until(a, port, Clock::now() + 300ms, error);
    reached += c.valid();
  }
  EXPECT_EQ(reached, fds.size());
}

TEST(ListenOn, ALoopbackAddressOtherThan127_0_0_1) {
  std::vector<Fd> fds = listen_on("127.0.1.1", 0);
  ASSERT_EQ(fds.size(), 1u);
  const int port = local_port(fds[0].get());
  std::string error;
  EXPECT_TRUE(connect_until("127.0.1.1", port, Clock::now() + 1s, error).valid()) << error;
  EXPECT_FALSE(connect_until("127.0.0.1", port, Clock::now() + 100ms, error).valid());
}

TEST(ConnectUntil, ReportsRefusedRounds) {
  const int port = ember::testing::free_port();
  std::vector<DialProgress> rounds;
  std::string error;
  Fd fd = connect_until("127.0.1.1", port, Clock::now() + 300ms, error,
                        [&](const DialProgress& p) { rounds.push_back(p); });
  EXPECT_FALSE(fd.valid());
  ASSERT_GE(rounds.size(), 2u);  // it kept retrying, reporting every round
  const DialProgress& last = rounds.back();
  EXPECT_TRUE(last.refused);
  EXPECT_EQ(last.addresses, std::vector<std::string>{"127.0.1.1:" + std::to_string(port)});
  EXPECT_NE(last.error.find("refused"), std::string::npos) << last.error;
  EXPECT_GE(last.waited, rounds.front().waited);
  EXPECT_GE(last.waited, 250ms);
}

TEST(ConnectUntil, ReportsAnUnresolvableName) {
  std::vector<DialProgress> rounds;
  std::string error;
  EXPECT_FALSE(connect_until("no-such-host.invalid", 1234, Clock::now() + 100ms, error,
                             [&](const DialProgress& p) { rounds.push_back(p); })
                   .valid());
  ASSERT_FALSE(rounds.empty());
  EXPECT_TRUE(rounds.back().addresses.empty());
  EXPECT_FALSE(rounds.back().refused);
  EXPECT_NE(error.find("cannot resolve 'no-such-host.invalid'"), std::string::npos) << error;
}

}  // namespace
}  // namespace ember::distributed::net
