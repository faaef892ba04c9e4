// TcpStore over real loopback sockets: the operations across threads and processes, timeouts,
// connection failures, port conflicts, and a server that shrugs off malformed clients.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <future>
#include <set>
#include <thread>

#include "distributed/socket_util.h"
#include "distributed/tcp_store.h"
#include "distributed/tcp_store_protocol.h"
#include "process_test_util.h"
#include "store_child_process.h"
#include "test_util.h"

namespace ember::distributed {
namespace {

using namespace std::chrono_literals;
using ember::testing::ChildProcess;

Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

std::unique_ptr<TcpStore> make_server(std::chrono::milliseconds timeout = 5s, const std::string& host = "127.0.0.1") {
  return std::make_unique<TcpStore>(host, 0, true, timeout);
}

std::unique_ptr<TcpStore> make_client(int port, std::chrono::milliseconds timeout = 5s,
                                      const std::string& host = "127.0.0.1") {
  return std::make_unique<TcpStore>(host, port, false, timeout);
}

using ember::testing::free_port;

// ---- raw sockets, for speaking bad protocol to the server

net::Fd raw_connect(int port) {
  std::string error;
  net::Fd fd = net::connect_until("127.0.0.1", port, net::Clock::now() + 2s, error);
  EXPECT_TRUE(fd.valid()) << error;
  return fd;
}

void raw_send(int fd, const std::vector<uint8_t>& data) {
  int err = 0;
  ASSERT_EQ(net::send_all(fd, data.data(), data.size(), net::Clock::now() + 2s, err), net::IoStatus::Ok);
}

std::vector<uint8_t> hello_frame() {
  wire::FrameWriter w(static_cast<uint8_t>(wire::Request::Hello));
  w.u32(wire::kMagic);
  w.u32(wire::kVersion);
  return w.finish();
}

// Sends a valid handshake and checks the reply.
void raw_handshake(int fd) {
  raw_send(fd, hello_frame());
  uint8_t reply[wire::kHeaderBytes + 8];
  int err = 0;
  ASSERT_EQ(net::recv_exact(fd, reply, sizeof(reply), net::Clock::now() + 2s, err), net::IoStatus::Ok);
  EXPECT_EQ(reply[0], static_cast<uint8_t>(wire::Reply::Ok));
  EXPECT_EQ(net::get_u32(reply + 5), wire::kMagic);
}

// True when the server closes the connection within 2 s (any bytes before the close are ignored).
bool server_closes(int fd) {
  auto deadline = net::Clock::now() + 2s;
  uint8_t buf[256];
  while (net::Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
  return false;
}

// The server still serves: a fresh client and an old one both round-trip a value.
void expect_store_healthy(TcpStore& existing, int port, const std::string& tag) {
  auto fresh = make_client(port, 2s);
  fresh->set_string("healthy/" + tag, tag);
  EXPECT_EQ(existing.get_string("healthy/" + tag), tag);
  int64_t after_add = fresh->add("healthy/count", 1);
  EXPECT_EQ(existing.add("healthy/count", 0), after_add);
}

// ---- operations

TEST(TcpStore, SetGetRoundTripsBinaryValues) {
  auto server = make_server();
  EXPECT_GT(server->port(), 0);
  EXPECT_TRUE(server->is_server());
  auto client = make_client(server->port());
  EXPECT_FALSE(client->is_server());

  Bytes binary = {0, 1, 2, 255, 0, 128};
  client->set("bin", binary);
  client->set("empty", {});
  server->set_string("text", "hello");
  EXPECT_EQ(server->get("bin"), binary);
  EXPECT_TRUE(server->get("empty").empty());
  EXPECT_EQ(client->get_string("text"), "hello");
  client->set_string("text", "overwritten");
  EXPECT_EQ(server->get_string("text"), "overwritten");
  EXPECT_EQ(client->num_keys(), 3);
}

TEST(TcpStore, LargeValueRoundTrips) {
  auto server = make_server();
  auto client = make_client(server->port());
  Bytes big(3 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 2654435761u >> 24);
  client->set("big", big);
  EXPECT_EQ(server->get("big"), big);
}

TEST(TcpStore, AddIsAtomicAcrossThreadsAndStoresDecimalText) {
  auto server = make_server();
  constexpr int kThreads = 4, kAdds = 100;
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      // Half the threads share the server's own store object, half have their own client.
      std::unique_ptr<TcpStore> own = t % 2 ? make_client(server->port()) : nullptr;
      TcpStore& store = own ? *own : *server;
      for (int i = 0; i < kAdds; ++i) seen[t].push_back(store.add("counter", 1));
    });
  for (auto& th : threads) th.join();

  std::set<int64_t> all;
  for (const auto& v : seen) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), size_t(kThreads * kAdds)) << "two adds returned the same value";
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kThreads * kAdds);
  EXPECT_EQ(server->get_string("counter"), std::to_string(kThreads * kAdds));
  EXPECT_EQ(server->add("counter", -kThreads * kAdds - 5), -5);
  EXPECT_EQ(server->get_string("counter"), "-5");
  EXPECT_EQ(server->add("fresh", 0), 0);
}

TEST(TcpStore, AddOnNonIntegerValueFailsAndTheConnectionStaysUsable) {
  auto server = make_server();
  auto client = make_client(server->port());
  client->set_string("word", "abc");
  EXPECT_EMBER_ERROR(client->add("word", 1), "add on key word", "not an integer");
  client->set_string("big", std::to_string(INT64_MAX));
  EXPECT_EMBER_ERROR(client->add("big", 1), "overflows int64");
  EXPECT_EQ(client->add("n", 2), 2);
  EXPECT_EQ(client->get_string("word"), "abc");
}

TEST(TcpStore, GetBlocksUntilAnotherClientSets) {
  auto server = make_server();
  auto reader = make_client(server->port());
  auto result = std::async(std::launch::async, [&] { return reader->get_string("late"); });
  auto writer = make_client(server->port());
  writer->set_string("late", "arrived");
  ASSERT_EQ(result.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(result.get(), "arrived");
}

TEST(TcpStore, OneStoreObjectServesConcurrentBlockingCalls) {
  // A get parked on the server must not block other calls through the same object.
  auto server = make_server();
  auto client = make_client(server->port());
  auto waiting = std::async(std::launch::async, [&] { return client->get_string("k"); });
  auto waiting2 = std::async(std::launch::async, [&] {
    client->wait({"k", "k2"});
    return client->get_string("k2");
  });
  client->set_string("k", "v");
  client->set_string("k2", "v2");
  ASSERT_EQ(waiting.wait_for(10s), std::future_status::ready);
  ASSERT_EQ(waiting2.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(waiting.get(), "v");
  EXPECT_EQ(waiting2.get(), "v2");
}

TEST(TcpStore, CheckAndWait) {
  auto server = make_server();
  auto client = make_client(server->port());
  EXPECT_FALSE(client->check({"a"}));
  EXPECT_TRUE(client->check({}));
  client->wait({});
  auto waiter = std::async(std::launch::async, [&] { client->wait({"a", "b", "c"}); });
  server->set_string("a", "1");
  server->set_string("b", "2");
  EXPECT_FALSE(client->check({"a", "b", "c"}));
  server->add("c", 1);
  ASSERT_EQ(waiter.wait_for(10s), std::future_status::ready);
  waiter.get();
  EXPECT_TRUE(client->check({"a", "b", "c"}));
}

TEST(TcpStore, WorksUnderPrefixStore) {
  auto server = make_server();
  auto shared = std::shared_ptr<Store>(make_client(server->port()));
  PrefixStore pg0("pg0", shared), pg1("pg1", shared);
  pg0.set_string("x", "zero");
  pg1.set_string("x", "one");
  EXPECT_EQ(pg0.get_string("x"), "zero");
  EXPECT_EQ(server->get_string("pg1/x"), "one");
  EXPECT_EQ(pg1.add("n", 3), 3);
}

// ---- timeouts and connection failures

TEST(TcpStore, GetTimeoutNamesTheKeyAndTheTimeout) {
  auto server = make_server(300ms);
  auto client = make_client(server->port(), 300ms);
  EXPECT_EMBER_ERROR(client->get("missing/key"), "timed out after 0.3s", "waiting for key missing/key");
  // The connection is still good after a server-side timeout.
  client->set_string("after", "ok");
  EXPECT_EQ(client->get_string("after"), "ok");
}

TEST(TcpStore, WaitTimeoutListsTheMissingKeys) {
  auto server = make_server(300ms);
  server->set_string("here", "1");
  EXPECT_EMBER_ERROR(server->wait({"here", "gone"}), "timed out after 0.3s", "waiting for keys here, gone",
                     "missing: gone");
}

TEST(TcpStore, ConnectTimeoutWhenNobodyListens) {
  int port = free_port();
  std::string where = "127.0.0.1:" + std::to_string(port);
  EXPECT_EMBER_ERROR(TcpStore("127.0.0.1", port, false, 300ms), "TcpStore: could not connect to the store at " + where,
                     "within 0.3s", "refused", "nothing accepts connections there");
}

TEST(TcpStore, ClientRetriesUntilTheServerStarts) {
  int port = free_port();
  auto client = std::async(std::launch::async, [&] { return make_client(port, 10s); });
  // Whether the client's first attempt happens before or after this, it must end up connected.
  TcpStore server("127.0.0.1", port, true, 10s);
  ASSERT_EQ(client.wait_for(15s), std::future_status::ready);
  auto c = client.get();
  c->set_string("hi", "there");
  EXPECT_EQ(server.get_string("hi"), "there");
}

TEST(TcpStore, ServerListensOnlyOnTheAddressGiven) {
  // 127.0.0.2 is another loopback address: a server there is not reachable at 127.0.0.1.
  auto server = make_server(2s, "127.0.0.2");
  EXPECT_EQ(server->host(), "127.0.0.2");
  auto via_own = make_client(server->port(), 2s, "127.0.0.2");
  via_own->set_string("k", "v");
  EXPECT_EMBER_ERROR(make_client(server->port(), 300ms, "127.0.0.1"), "could not connect to the store at 127.0.0.1:");
}

TEST(TcpStore, ServerOnANameAnswersOnEveryAddressItResolvesTo) {
  // "localhost" is ::1 and 127.0.0.1 on most machines: a client may dial either.
  auto server = make_server(2s, "localhost");
  EXPECT_EQ(server->host(), "localhost");
  const std::vector<std::string> addresses = net::resolve_addresses("localhost");
  ASSERT_FALSE(addresses.empty());
  for (const std::string& a : addresses) {
    auto client = make_client(server->port(), 2s, a);
    client->set_string("via " + a, "1");
  }
  EXPECT_EQ(server->num_keys(), int64_t(addresses.size()));
}

TEST(TcpStore, ClientErrorsNameWhoDialled) {
  const int port = free_port();
  EXPECT_EMBER_ERROR(TcpStore("localhost", port, false, 200ms, "rank 3"),
                     "TcpStore: rank 3 could not connect to the store at localhost:" + std::to_string(port) + " (",
                     "within 0.2s");
}

TEST(TcpStore, WildcardServerAndHostnameClient) {
  auto server = make_server(2s, "0.0.0.0");
  auto by_name = make_client(server->port(), 2s, "localhost");
  by_name->set_string("k", "v");
  EXPECT_EQ(server->get_string("k"), "v");
}

TEST(TcpStore, PortInUseIsAClearError) {
  auto first = make_server();
  int port = first->port();
  EXPECT_EMBER_ERROR(TcpStore("127.0.0.1", port, true, 1s),
                     "TcpStore: port " + std::to_string(port) + " on 127.0.0.1 is already in use",
                     "set MASTER_PORT");
  // A wildcard listener on the same port conflicts as well.
  EXPECT_EMBER_ERROR(TcpStore("0.0.0.0", port, true, 1s), "is already in use");
  // The first store is unharmed.
  first->set_string("k", "v");
  EXPECT_EQ(first->get_string("k"), "v");
}

TEST(TcpStore, PortIsReusableRightAfterAStoreCloses) {
  // Closed connections linger in TIME_WAIT; SO_REUSEADDR must let the next job bind anyway.
  int port;
  {
    auto server = make_server();
    port = server->port();
    auto client = make_client(port);
    client->set_string("k", "v");
    EXPECT_EQ(server->get_string("k"), "v");
  }
  TcpStore again("127.0.0.1", port, true, 2s);
  EXPECT_EQ(again.port(), port);
  EXPECT_FALSE(again.check({"k"}));
}

TEST(TcpStore, ClientArgumentsAreValidated) {
  EXPECT_EMBER_ERROR(TcpStore("127.0.0.1", 0, false, 1s), "needs the server's port");
  EXPECT_EMBER_ERROR(TcpStore("127.0.0.1", 70000, true, 1s), "port 70000 is out of range");
}

TEST(TcpStore, ServerGoingAwayFailsAWaitingClient) {
  auto server = make_server(30s);
  int port = server->port();
  auto client = make_client(port, 30s);
  auto waiting = std::async(std::launch::async, [&] { client->get("never"); });
  server.reset();  // stops the server thread, closing every connection
  ASSERT_EQ(waiting.wait_for(20s), std::future_status::ready) << "the client hung after the server went away";
  EXPECT_EMBER_ERROR(waiting.get(),
                     "TcpStore: connection to the store at 127.0.0.1:" + std::to_string(port) +
                         " was lost while waiting for key never");
}

TEST(TcpStore, ServerProcessKilledMidWaitFailsTheClient) {
  ChildProcess server({std::string(EMBER_TEST_PROGRAMS) + "/store_client", "serve", "127.0.0.1", "60000"});
  std::optional<std::string> line = server.read_line(20s);
  ASSERT_TRUE(line) << "the store process printed no port: " << server.output();
  int port = std::stoi(*line);
  auto client = make_client(port, 30s);
  client->set_string("before", "1");
  auto waiting = std::async(std::launch::async, [&] { client->wait({"before", "never"}); });
  server.kill();
  ASSERT_EQ(waiting.wait_for(20s), std::future_status::ready) << "the client hung after the store process died";
  EXPECT_EMBER_ERROR(waiting.get(), "was lost while waiting for keys before, never");
  // Later calls fail at once instead of retrying for the whole 30 s timeout.
  EXPECT_EMBER_ERROR(client->get("before"),
                     "TcpStore: could not reconnect to 127.0.0.1:" + std::to_string(port) + " after a connection");
}

// ---- size limits

TEST(TcpStore, OversizedKeysAndValuesAreRejected) {
  auto server = make_server();
  auto client = make_client(server->port());
  std::string longest(wire::kMaxKeyBytes, 'k');
  client->set_string(longest, "fits");
  EXPECT_EQ(client->get_string(longest), "fits");
  std::string too_long(wire::kMaxKeyBytes + 1, 'k');
  EXPECT_EMBER_ERROR(client->set_string(too_long, "x"), "a key of 4097 bytes exceeds the limit of 4096 bytes");
  EXPECT_EMBER_ERROR(client->get(too_long), "exceeds the limit");
  EXPECT_EMBER_ERROR(client->wait({"ok", too_long}), "exceeds the limit");
  Bytes huge(wire::kMaxValueBytes + 1);
  EXPECT_EMBER_ERROR(client->set("huge", huge), "value of 67108865 bytes for key huge exceeds the limit");
  std::vector<std::string> many(wire::kMaxKeysPerRequest + 1, "k");
  EXPECT_EMBER_ERROR(client->check(many), "check on 65537 keys");
  expect_store_healthy(*client, server->port(), "limits");
}

// ---- malformed clients

class TcpStoreMalformed : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = make_server(2s);
    client_ = make_client(server_->port(), 2s);
    client_->set_string("healthy/count", "0");
  }
  void expect_closed_then_healthy(int fd, const std::string& tag) {
    EXPECT_TRUE(server_closes(fd)) << "the server kept a connection that sent " << tag;
    expect_store_healthy(*client_, server_->port(), tag);
  }
  std::unique_ptr<TcpStore> server_, client_;
};

TEST_F(TcpStoreMalformed, GarbageBytes) {
  net::Fd fd = raw_connect(server_->port());
  raw_send(fd.get(), bytes("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
  expect_closed_then_healthy(fd.get(), "garbage");
}

TEST_F(TcpStoreMalformed, RequestWithoutHandshake) {
  net::Fd fd = raw_connect(server_->port());
  wire::FrameWriter w(static_cast<uint8_t>(wire::Request::Set));
  w.key("sneaky");
  w.blob("v", 1);
  raw_send(fd.get(), w.finish());
  expect_closed_then_healthy(fd.get(), "no-handshake");
  EXPECT_FALSE(client_->check({"sneaky"}));
}

TEST_F(TcpStoreMalformed, WrongMagicInHandshake) {
  net::Fd fd = raw_connect(server_->port());
  wire::FrameWriter w(static_cast<uint8_t>(wire::Request::Hello));
  w.u32(0x12345678);
  w.u32(wire::kVersion);
  raw_send(fd.get(), w.finish());
  expect_closed_then_healthy(fd.get(), "bad-magic");
}

TEST_F(TcpStoreMalformed, HugeLengthPrefix) {
  net::Fd fd = raw_connect(server_->port());
  raw_handshake(fd.get());
  // Claims a 4 GiB body: refused on the header alone, nothing allocated for it.
  std::vector<uint8_t> header = {static_cast<uint8_t>(wire::Request::Set), 0xff, 0xff, 0xff, 0xff};
  raw_send(fd.get(), header);
  expect_closed_then_healthy(fd.get(), "huge-length");
}

TEST_F(TcpStoreMalformed, OversizedBodyForItsType) {
  net::Fd fd = raw_connect(server_->port());
  raw_handshake(fd.get());
  std::vector<uint8_t> header(5);
  header[0] = static_cast<uint8_t>(wire::Request::Get);
  net::put_u32(&header[1], 1 << 20);
  raw_send(fd.get(), header);
  expect_closed_then_healthy(fd.get(), "oversized-get");
}

TEST_F(TcpStoreMalformed, UnknownMessageType) {
  net::Fd fd = raw_connect(server_->port());
  raw_handshake(fd.get());
  raw_send(fd.get(), {99, 0, 0, 0, 0});
  expect_closed_then_healthy(fd.get(), "unknown-type");
}

TEST_F(TcpStoreMalformed, KeyLongerThanTheLimit) {
  net::Fd fd = raw_connect(server_->port());
  raw_handshake(fd.get());
  wire::FrameWriter w(static_cast<uint8_t>(wire::Request::Set));
  w.key(std::string(wire::kMaxKeyBytes + 1, 'k'));
  w.blob("v", 1);
  raw_send(fd.get(), w.finish());
  expect_closed_then_healthy(fd.get(), "long-key");
  EXPECT_EQ(client_->num_keys(), 2);  // healthy/count and healthy/long-key only
}

TEST_F(TcpStoreMalformed, FieldLengthsThatDisagreeWithTheBody) {
  net::Fd fd = raw_connect(server_->port());
  raw_handshake(fd.get());
  wire::FrameWriter w(static_cast<uint8_t>(wire::Request::Set));
  w.u32(1000);  // key length pointing past the end of the body
  w.raw("abc", 3);
  raw_send(fd.get(), w.finish());
  expect_closed_then_healthy(fd.get(), "inconsistent");
}

TEST_F(TcpStoreMalformed, TrailingBytesAndLyingKeyCounts) {
  net::Fd a = raw_connect(server_->port());
  raw_handshake(a.get());
  wire::FrameWriter w(static_cast<uint8_t>(wire::Request::Add));
  w.key("n");
  w.i64(1);
  w.u8(7);  // one byte more than an Add carries
  raw_send(a.get(), w.finish());
  expect_closed_then_healthy(a.get(), "trailing");

  net::Fd b = raw_connect(server_->port());
  raw_handshake(b.get());
  wire::FrameWriter c(static_cast<uint8_t>(wire::Request::Check));
  c.u32(1000000);  // a million keys announced, none sent
  raw_send(b.get(), c.finish());
  expect_closed_then_healthy(b.get(), "key-count");
}

TEST_F(TcpStoreMalformed, NegativeTimeout) {
  net::Fd fd = raw_connect(server_->port());
  raw_handshake(fd.get());
  wire::FrameWriter w(static_cast<uint8_t>(wire::Request::Get));
  w.key("k");
  w.i64(-1);
  raw_send(fd.get(), w.finish());
  expect_closed_then_healthy(fd.get(), "negative-timeout");
}

TEST_F(TcpStoreMalformed, PipelinedRequestWhileAGetIsParked) {
  net::Fd fd = raw_connect(server_->port());
  raw_handshake(fd.get());
  wire::FrameWriter get(static_cast<uint8_t>(wire::Request::Get));
  get.key("not-yet");
  get.i64(60000);
  raw_send(fd.get(), get.finish());
  raw_send(fd.get(), hello_frame());
  expect_closed_then_healthy(fd.get(), "pipelined");
}

TEST_F(TcpStoreMalformed, HalfSentFrameDoesNotStallOthers) {
  net::Fd fd = raw_connect(server_->port());
  raw_handshake(fd.get());
  wire::FrameWriter w(static_cast<uint8_t>(wire::Request::Set));
  w.key("partial");
  w.blob(std::string(1000, 'x').data(), 1000);
  std::vector<uint8_t> frame = w.finish();
  frame.resize(frame.size() / 2);
  raw_send(fd.get(), frame);
  expect_store_healthy(*client_, server_->port(), "while-partial");
  EXPECT_FALSE(client_->check({"partial"}));
}

TEST_F(TcpStoreMalformed, ManyAbruptDisconnects) {
  for (int i = 0; i < 50; ++i) {
    net::Fd fd = raw_connect(server_->port());
    if (i % 2) raw_handshake(fd.get());
    if (i % 3 == 0) raw_send(fd.get(), {static_cast<uint8_t>(wire::Request::Set), 10, 0});
  }
  expect_store_healthy(*client_, server_->port(), "after-disconnects");
}

// ---- real processes

TEST(TcpStore, ExchangeAcrossProcesses) {
  constexpr int kWorld = 4;
  auto server = make_server(20s);
  std::vector<std::unique_ptr<ChildProcess>> children;
  for (int rank = 1; rank < kWorld; ++rank)
    children.push_back(std::make_unique<ChildProcess>(std::vector<std::string>{
        std::string(EMBER_TEST_PROGRAMS) + "/store_client", "exchange", "127.0.0.1", std::to_string(server->port()),
        std::to_string(rank), std::to_string(kWorld), "20000"}));
  server->set_string("value/0", "v0");
  server->add("counter", 1);
  for (int r = 0; r < kWorld; ++r) {
    std::string rank = std::to_string(r);
    EXPECT_EQ(server->get_string("value/" + rank), "v" + rank);
  }
  for (int i = 0; i < kWorld - 1; ++i) {
    int code = children[i]->wait(30s);
    EXPECT_EQ(code, 0) << "rank " << i + 1 << " output: " << children[i]->output();
    EXPECT_NE(children[i]->output().find("rank " + std::to_string(i + 1) + " ok"), std::string::npos);
  }
  EXPECT_EQ(server->add("counter", 0), kWorld);
}

}  // namespace
}  // namespace ember::distributed
