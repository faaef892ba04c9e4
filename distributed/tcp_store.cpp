#include "distributed/tcp_store.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "distributed/tcp_store_protocol.h"
#include "distributed/tcp_store_server.h"

namespace ember::distributed {

namespace {

using net::Clock;
using wire::Reply;
using wire::Request;

// Extra time a waiting call allows the server beyond the server-side deadline before deciding
// the server itself has stalled.
constexpr std::chrono::milliseconds kReplyGrace{2000};
// How long a store that already lost a connection keeps trying to open a new one.
constexpr std::chrono::milliseconds kReconnectWindow{1000};
// A client still dialling after kFirstNotice says so on stderr, then again every kNoticeEvery:
// a rank waiting on a wrong address must not sit silent until its timeout.
constexpr std::chrono::seconds kFirstNotice{3};
constexpr std::chrono::seconds kNoticeEvery{30};

std::string describe_keys(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 8;
  std::string out;
  for (size_t i = 0; i < keys.size() && i < kShown; ++i) out += (i ? ", " : "") + keys[i];
  if (keys.size() > kShown) out += ", ... (" + std::to_string(keys.size() - kShown) + " more)";
  return out;
}

void check_key(const std::string& key) {
  EMBER_CHECK(key.size() <= wire::kMaxKeyBytes, "TcpStore: a key of ", key.size(), " bytes exceeds the limit of ",
              wire::kMaxKeyBytes, " bytes (key starts with '", key.substr(0, 40), "')");
}

void check_keys(const std::vector<std::string>& keys, const char* op) {
  size_t encoded = 4;
  for (const auto& k : keys) {
    check_key(k);
    encoded += 4 + k.size();
  }
  EMBER_CHECK(keys.size() <= wire::kMaxKeysPerRequest && encoded <= wire::kMaxKeyListBytes, "TcpStore: ", op,
              " on ", keys.size(), " keys (", encoded, " bytes) exceeds the limit of ", wire::kMaxKeysPerRequest,
              " keys and ", wire::kMaxKeyListBytes, " bytes per request");
}

// The address a server's own client uses to reach it.
std::string reachable_host(const std::string& listen_host) {
  if (listen_host.empty() || listen_host == "0.0.0.0") return "127.0.0.1";
  if (listen_host == "::") return "::1";
  return listen_host;
}

std::string lost_suffix(int err) { return err ? " (" + net::errno_text(err) + ")" : ""; }

// What a failed dial means, for the person reading it.
std::string dial_hint(const net::DialProgress& p) {
  if (p.addresses.empty()) return "the name does not resolve: check the address given for the store";
  if (p.refused)
    return "nothing accepts connections there: is rank 0, which serves the store, running, and is this "
           "the address it listens on?";
  return "no answer: is the address right, and does a firewall let the port through?";
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out;
}

}  // namespace

struct TcpStore::ReplyFrame {
  Reply status;
  std::vector<uint8_t> payload;
};

TcpStore::TcpStore(std::string host, int port, bool is_server, std::chrono::milliseconds timeout, std::string who)
    : host_(std::move(host)), port_(port), who_(std::move(who)) {
  timeout_ = timeout;
  EMBER_CHECK(port >= 0 && port <= 65535, "TcpStore: port ", port, " is out of range (0..65535)");
  EMBER_CHECK(is_server || port != 0, "TcpStore: a client needs the server's port (got 0)");
  if (is_server) {
    server_ = std::make_unique<TcpStoreServer>(host_, port);
    port_ = server_->port();
    connect_host_ = reachable_host(host_);
  } else {
    connect_host_ = host_;
  }
  // Connect now so that an unreachable store fails here, not at the first call.
  release(connect_new());
}

TcpStore::~TcpStore() {
  idle_.clear();
  server_.reset();
}

std::string TcpStore::where() const { return net::host_port(connect_host_, port_); }

std::string TcpStore::where_dialled(const std::vector<std::string>& addresses) const {
  // A literal dials itself: naming it twice would say nothing.
  if (addresses.empty() || (addresses.size() == 1 && addresses[0] == where())) return where();
  return where() + " (" + join(addresses) + ")";
}

net::Fd TcpStore::connect_new() {
  bool reconnecting = lost_.load();
  auto deadline = Clock::now() + (reconnecting ? std::min(timeout(), kReconnectWindow) : timeout());
  const std::string subject = who_.empty() ? std::string() : who_ + " ";
  std::string last_error;
  net::DialProgress last;
  std::chrono::steady_clock::duration next_notice = kFirstNotice;
  auto report = [&](const net::DialProgress& p) {
    last = p;
    if (reconnecting || p.waited < next_notice) return;
    next_notice = p.waited + kNoticeEvery;
    const std::chrono::seconds waited = std::chrono::duration_cast<std::chrono::seconds>(p.waited);
    std::fprintf(stderr,
                 "TcpStore: %sis still dialling the store at %s after %s: %s (%s); retrying until the timeout of %s\n",
                 subject.c_str(), where_dialled(p.addresses).c_str(), net::format_seconds(waited).c_str(),
                 p.error.c_str(), dial_hint(p).c_str(), net::format_seconds(timeout()).c_str());
    std::fflush(stderr);
  };
  net::Fd fd = net::connect_until(connect_host_, port_, deadline, last_error, report);
  EMBER_CHECK(fd.valid() || !reconnecting, "TcpStore: ", subject, "could not reconnect to ", where(),
              " after a connection to it was lost (", last_error, ")");
  EMBER_CHECK(fd.valid(), "TcpStore: ", subject, "could not connect to the store at ", where_dialled(last.addresses),
              " within ", net::format_seconds(timeout()), ": ", last_error, " (", dial_hint(last), ")");

  // Handshake: proves the listener is an Ember store speaking this protocol version.
  wire::FrameWriter hello(static_cast<uint8_t>(Request::Hello));
  hello.u32(wire::kMagic);
  hello.u32(wire::kVersion);
  std::vector<uint8_t> frame = hello.finish();
  auto reply_deadline = std::max(deadline, Clock::now() + std::chrono::seconds(1));
  uint8_t reply[wire::kHeaderBytes + 8];
  int err = 0;
  net::IoStatus st = net::send_all(fd.get(), frame.data(), frame.size(), reply_deadline, err);
  if (st == net::IoStatus::Ok) st = net::recv_exact(fd.get(), reply, sizeof(reply), reply_deadline, err);
  EMBER_CHECK(st == net::IoStatus::Ok, "TcpStore: ", where(), " did not answer as an Ember store (",
              st == net::IoStatus::Timeout ? "no handshake reply" : "connection closed during the handshake",
              lost_suffix(err), ")");
  bool ok = reply[0] == static_cast<uint8_t>(Reply::Ok) && net::get_u32(reply + 1) == 8 &&
            net::get_u32(reply + 5) == wire::kMagic && net::get_u32(reply + 9) == wire::kVersion;
  EMBER_CHECK(ok, "TcpStore: ", where(), " did not answer as an Ember store (unexpected handshake reply)");
  return fd;
}

net::Fd TcpStore::acquire() {
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    if (!idle_.empty()) {
      net::Fd fd = std::move(idle_.back());
      idle_.pop_back();
      return fd;
    }
  }
  return connect_new();
}

void TcpStore::release(net::Fd fd) {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  idle_.push_back(std::move(fd));
}

TcpStore::ReplyFrame TcpStore::call(const std::vector<uint8_t>& frame, const std::string& what,
                                    std::chrono::milliseconds reply_within) {
  // A connection that fails mid-call is dropped (its Fd closes), never returned to the pool.
  net::Fd fd = acquire();
  auto lost = [&](int err) {
    lost_ = true;
    return Error("TcpStore: connection to the store at " + where() + " was lost while " + what + lost_suffix(err));
  };
  int err = 0;
  net::IoStatus st = net::send_all(fd.get(), frame.data(), frame.size(), Clock::now() + timeout(), err);
  if (st == net::IoStatus::Closed) throw lost(err);
  EMBER_CHECK(st == net::IoStatus::Ok, "TcpStore: the store at ", where(), " did not take a request within ",
              net::format_seconds(timeout()), " while ", what);

  auto deadline = Clock::now() + reply_within;
  uint8_t header[wire::kHeaderBytes];
  st = net::recv_exact(fd.get(), header, sizeof(header), deadline, err);
  if (st == net::IoStatus::Closed) throw lost(err);
  EMBER_CHECK(st == net::IoStatus::Ok, "TcpStore: no reply from the store at ", where(), " within ",
              net::format_seconds(reply_within), " while ", what);
  uint32_t size = net::get_u32(header + 1);
  EMBER_CHECK(header[0] <= static_cast<uint8_t>(Reply::Error) && size <= wire::kMaxReplyBytes,
              "TcpStore: the store at ", where(), " sent a malformed reply while ", what);
  ReplyFrame reply{static_cast<Reply>(header[0]), std::vector<uint8_t>(size)};
  st = net::recv_exact(fd.get(), reply.payload.data(), size, deadline, err);
  if (st == net::IoStatus::Closed) throw lost(err);
  EMBER_CHECK(st == net::IoStatus::Ok, "TcpStore: no reply from the store at ", where(), " within ",
              net::format_seconds(reply_within), " while ", what);
  release(std::move(fd));
  if (reply.status == Reply::Error) {
    size_t n = std::min(reply.payload.size(), wire::kMaxErrorBytes);
    EMBER_FAIL("TcpStore: ", std::string(reply.payload.begin(), reply.payload.begin() + n));
  }
  return reply;
}

void TcpStore::set(const std::string& key, const Bytes& value) {
  check_key(key);
  EMBER_CHECK(value.size() <= wire::kMaxValueBytes, "TcpStore: a value of ", value.size(), " bytes for key ", key,
              " exceeds the limit of ", wire::kMaxValueBytes, " bytes (64 MiB)");
  wire::FrameWriter w(static_cast<uint8_t>(Request::Set), 8 + key.size() + value.size());
  w.key(key);
  w.blob(value.data(), value.size());
  ReplyFrame r = call(w.finish(), "setting key " + key, timeout());
  EMBER_CHECK(r.status == Reply::Ok, "TcpStore: unexpected reply to set of key ", key);
}

Bytes TcpStore::get(const std::string& key) {
  check_key(key);
  wire::FrameWriter w(static_cast<uint8_t>(Request::Get));
  w.key(key);
  w.i64(std::max<int64_t>(timeout().count(), 0));
  ReplyFrame r = call(w.finish(), "waiting for key " + key, timeout() + kReplyGrace);
  EMBER_CHECK(r.status != Reply::Timeout, "TcpStore: timed out after ", net::format_seconds(timeout()),
              " waiting for key ", key, " (store at ", where(), ")");
  return std::move(r.payload);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  check_key(key);
  wire::FrameWriter w(static_cast<uint8_t>(Request::Add));
  w.key(key);
  w.i64(delta);
  ReplyFrame r = call(w.finish(), "adding to key " + key, timeout());
  EMBER_CHECK(r.status == Reply::Ok && r.payload.size() == 8, "TcpStore: unexpected reply to add on key ", key);
  return static_cast<int64_t>(net::get_u64(r.payload.data()));
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  check_keys(keys, "check");
  wire::FrameWriter w(static_cast<uint8_t>(Request::Check));
  w.keys(keys);
  ReplyFrame r = call(w.finish(), "checking keys " + describe_keys(keys), timeout());
  EMBER_CHECK(r.status == Reply::Ok && r.payload.size() == 1, "TcpStore: unexpected reply to check");
  return r.payload[0] != 0;
}

void TcpStore::wait(const std::vector<std::string>& keys) {
  if (keys.empty()) return;
  check_keys(keys, "wait");
  wire::FrameWriter w(static_cast<uint8_t>(Request::Wait));
  w.keys(keys);
  w.i64(std::max<int64_t>(timeout().count(), 0));
  std::string what = (keys.size() == 1 ? "waiting for key " : "waiting for keys ") + describe_keys(keys);
  ReplyFrame r = call(w.finish(), what, timeout() + kReplyGrace);
  if (r.status == Reply::Timeout) {
    wire::BodyReader reader(r.payload.data(), r.payload.size());
    std::vector<std::string> missing = reader.keys();
    EMBER_FAIL("TcpStore: timed out after ", net::format_seconds(timeout()), " ", what,
               " (missing: ", reader.ok() ? describe_keys(missing) : std::string("?"), "; store at ", where(), ")");
  }
}

int64_t TcpStore::num_keys() {
  wire::FrameWriter w(static_cast<uint8_t>(Request::NumKeys));
  ReplyFrame r = call(w.finish(), "counting keys", timeout());
  EMBER_CHECK(r.status == Reply::Ok && r.payload.size() == 8, "TcpStore: unexpected reply to num_keys");
  return static_cast<int64_t>(net::get_u64(r.payload.data()));
}

}  // namespace ember::distributed
