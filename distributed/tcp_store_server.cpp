#include "distributed/tcp_store_server.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdio>
#include <limits>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "distributed/tcp_store_protocol.h"

namespace ember::distributed {

namespace {

using net::Clock;
using wire::Reply;
using wire::Request;

// More simultaneous clients than any job needs; beyond it new connections are closed at once.
constexpr size_t kMaxConnections = 8192;
constexpr size_t kReadChunk = 64 * 1024;
// Deadlines further out than this are capped (avoids time_point overflow).
constexpr int64_t kMaxWaitMs = int64_t(365) * 24 * 3600 * 1000;

struct PendingRequest {
  bool is_get = false;  // Get answers with the value; Wait with an empty Ok
  std::vector<std::string> keys;
  Clock::time_point deadline;
};

struct Connection {
  net::Fd fd;
  std::string peer;
  bool greeted = false;
  bool dead = false;
  std::vector<uint8_t> in;  // the frame being received (never more than one)
  std::vector<uint8_t> out;
  size_t out_sent = 0;
  std::optional<PendingRequest> pending;

  // A client awaiting a reply must not send anything.
  bool busy() const { return pending.has_value() || out_sent < out.size(); }
};

// A broken rule: the connection is closed and the reason logged.
struct ProtocolViolation {
  std::string reason;
};

}  // namespace

class TcpStoreServer::Loop {
 public:
  Loop(std::vector<net::Fd> listeners, net::Fd wake_read)
      : listeners_(std::move(listeners)), wake_read_(std::move(wake_read)) {}

  void run() {
    std::vector<pollfd> fds;
    while (true) {
      fds.clear();
      fds.push_back({wake_read_.get(), POLLIN, 0});
      bool listening = Clock::now() >= accept_paused_until_;
      for (const auto& l : listeners_) fds.push_back({l.get(), static_cast<short>(listening ? POLLIN : 0), 0});
      const size_t first_conn = 1 + listeners_.size();
      for (auto& c : conns_) {
        short events = POLLIN | POLLRDHUP;
        if (c->out_sent < c->out.size()) events |= POLLOUT;
        fds.push_back({c->fd.get(), events, 0});
      }
      int rc = ::poll(fds.data(), fds.size(), poll_timeout_ms());
      if (rc < 0 && errno != EINTR) {
        std::fprintf(stderr, "TcpStore: server poll failed: %s\n", net::errno_text(errno).c_str());
        break;
      }
      if (rc > 0 && (fds[0].revents & POLLIN)) break;  // the owner is shutting down

      // Connections accepted below are not in `fds`: walk only the ones polled.
      size_t polled = conns_.size();
      for (size_t i = 0; i < polled; ++i) {
        short revents = fds[first_conn + i].revents;
        if (rc > 0 && revents) serve(*conns_[i], revents);
      }
      expire_waits(Clock::now());
      std::erase_if(conns_, [](const std::unique_ptr<Connection>& c) { return c->dead; });
      for (size_t l = 0; l < listeners_.size(); ++l)
        if (rc > 0 && (fds[1 + l].revents & POLLIN)) accept_all(listeners_[l].get());
    }
    conns_.clear();  // closing the sockets tells every client the store is gone
  }

 private:
  int poll_timeout_ms() const {
    std::optional<Clock::time_point> next;
    for (const auto& c : conns_)
      if (c->pending && (!next || c->pending->deadline < *next)) next = c->pending->deadline;
    if (Clock::now() < accept_paused_until_ && (!next || accept_paused_until_ < *next)) next = accept_paused_until_;
    if (!next) return -1;
    auto left = std::chrono::ceil<std::chrono::milliseconds>(*next - Clock::now()).count();
    return static_cast<int>(std::clamp<int64_t>(left, 0, INT_MAX));
  }

  void accept_all(int listener) {
    while (true) {
      int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors: stop accepting briefly instead of spinning on a readable listener.
          accept_paused_until_ = Clock::now() + std::chrono::milliseconds(100);
        }
        return;
      }
      net::Fd owned(fd);
      if (conns_.size() >= kMaxConnections) continue;  // closed by `owned`
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
      auto c = std::make_unique<Connection>();
      c->peer = net::peer_name(fd);
      c->fd = std::move(owned);
      conns_.push_back(std::move(c));
    }
  }

  void serve(Connection& c, short revents) {
    try {
      if (revents & POLLOUT) flush(c);
      if (!c.dead && (revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) receive(c);
    } catch (const ProtocolViolation& v) {
      std::fprintf(stderr, "TcpStore: closing the connection from %s: %s\n", c.peer.c_str(), v.reason.c_str());
      c.dead = true;
    } catch (const std::exception& e) {
      // E.g. bad_alloc for a large value: only this client is dropped.
      std::fprintf(stderr, "TcpStore: closing the connection from %s: %s\n", c.peer.c_str(), e.what());
      c.dead = true;
    }
  }

  // Reads at most the rest of the current frame, handling it once complete.
  void receive(Connection& c) {
    while (!c.dead) {
      if (c.busy()) {
        uint8_t probe;
        ssize_t n = ::recv(c.fd.get(), &probe, 1, 0);
        if (n == 0) c.dead = true;  // the client went away while waiting: drop its request
        if (n > 0) throw ProtocolViolation{"sent a request before reading the previous reply"};
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) c.dead = true;
        return;
      }
      size_t want = wire::kHeaderBytes - std::min(c.in.size(), wire::kHeaderBytes);
      if (want == 0) want = wire::kHeaderBytes + net::get_u32(&c.in[1]) - c.in.size();
      size_t have = c.in.size();
      size_t chunk = std::min(want, kReadChunk);
      c.in.resize(have + chunk);
      ssize_t n = ::recv(c.fd.get(), c.in.data() + have, chunk, 0);
      c.in.resize(have + static_cast<size_t>(std::max<ssize_t>(n, 0)));
      if (n == 0) {
        c.dead = true;  // orderly close
        return;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) c.dead = true;
        return;
      }
      if (have < wire::kHeaderBytes && c.in.size() >= wire::kHeaderBytes) check_header(c);
      if (c.in.size() >= wire::kHeaderBytes && c.in.size() == wire::kHeaderBytes + net::get_u32(&c.in[1])) {
        std::vector<uint8_t> frame = std::move(c.in);
        c.in.clear();
        handle(c, frame[0], frame.data() + wire::kHeaderBytes, frame.size() - wire::kHeaderBytes);
      }
    }
  }

  static void check_header(const Connection& c) {
    uint8_t type = c.in[0];
    uint32_t body = net::get_u32(&c.in[1]);
    std::optional<size_t> limit = wire::max_request_body(type);
    if (!limit) throw ProtocolViolation{"unknown message type " + std::to_string(type)};
    if (!c.greeted && type != static_cast<uint8_t>(Request::Hello))
      throw ProtocolViolation{"the first message was not a store handshake"};
    if (body > *limit)
      throw ProtocolViolation{"message of " + std::to_string(body) + " bytes exceeds the limit of " +
                              std::to_string(*limit) + " for its type"};
  }

  void handle(Connection& c, uint8_t type, const uint8_t* body, size_t size) {
    wire::BodyReader r(body, size);
    auto expect_done = [&] {
      if (!r.done()) throw ProtocolViolation{"malformed message of type " + std::to_string(type)};
    };
    switch (static_cast<Request>(type)) {
      case Request::Hello: {
        uint32_t magic = r.u32();
        uint32_t version = r.u32();
        expect_done();
        if (c.greeted) throw ProtocolViolation{"repeated handshake"};
        if (magic != wire::kMagic || version != wire::kVersion)
          throw ProtocolViolation{"handshake with a wrong magic number or protocol version"};
        c.greeted = true;
        wire::FrameWriter w(static_cast<uint8_t>(Reply::Ok));
        w.u32(wire::kMagic);
        w.u32(wire::kVersion);
        send(c, w.finish());
        return;
      }
      case Request::Set: {
        std::string key = r.key();
        std::vector<uint8_t> value = r.blob(wire::kMaxValueBytes);
        expect_done();
        data_[std::move(key)] = std::move(value);
        reply(c, Reply::Ok, nullptr, 0);
        wake_waiters();
        return;
      }
      case Request::Get:
      case Request::Wait: {
        bool is_get = static_cast<Request>(type) == Request::Get;
        std::vector<std::string> keys;
        if (is_get) keys.push_back(r.key());
        else keys = r.keys();
        int64_t timeout_ms = r.i64();
        expect_done();
        if (timeout_ms < 0) throw ProtocolViolation{"negative timeout"};
        c.pending = PendingRequest{is_get, std::move(keys),
                                   Clock::now() + std::chrono::milliseconds(std::min(timeout_ms, kMaxWaitMs))};
        try_answer(c);  // otherwise parked until the keys appear or the deadline passes
        return;
      }
      case Request::Add: {
        std::string key = r.key();
        int64_t delta = r.i64();
        expect_done();
        add(c, key, delta);
        return;
      }
      case Request::Check: {
        std::vector<std::string> keys = r.keys();
        expect_done();
        uint8_t all = std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data_.count(k) > 0; });
        reply(c, Reply::Ok, &all, 1);
        return;
      }
      case Request::NumKeys: {
        expect_done();
        wire::FrameWriter w(static_cast<uint8_t>(Reply::Ok));
        w.i64(static_cast<int64_t>(data_.size()));
        send(c, w.finish());
        return;
      }
    }
    throw ProtocolViolation{"unknown message type " + std::to_string(type)};
  }

  void add(Connection& c, const std::string& key, int64_t delta) {
    int64_t current = 0;
    auto it = data_.find(key);
    if (it != data_.end()) {
      const char* first = reinterpret_cast<const char*>(it->second.data());
      const char* last = first + it->second.size();
      auto [ptr, ec] = std::from_chars(first, last, current);
      if (ec != std::errc() || ptr != last || first == last) {
        std::string msg = "add on key " + key + ": the stored value is not an integer";
        reply(c, Reply::Error, msg.data(), msg.size());
        return;
      }
    }
    int64_t result;
    if (__builtin_add_overflow(current, delta, &result)) {
      std::string msg = "add on key " + key + " overflows int64 (" + std::to_string(current) + " + " +
                        std::to_string(delta) + ")";
      reply(c, Reply::Error, msg.data(), msg.size());
      return;
    }
    // Stored as decimal text so get() on a counter reads naturally.
    std::string text = std::to_string(result);
    data_[key] = std::vector<uint8_t>(text.begin(), text.end());
    wire::FrameWriter w(static_cast<uint8_t>(Reply::Ok));
    w.i64(result);
    send(c, w.finish());
    wake_waiters();
  }

  // Answers c's parked request if all its keys exist; returns whether it did.
  bool try_answer(Connection& c) {
    PendingRequest& p = *c.pending;
    for (const auto& k : p.keys)
      if (!data_.count(k)) return false;
    if (p.is_get) {
      const auto& value = data_.at(p.keys.front());
      c.pending.reset();
      reply(c, Reply::Ok, value.data(), value.size());
    } else {
      c.pending.reset();
      reply(c, Reply::Ok, nullptr, 0);
    }
    return true;
  }

  void wake_waiters() {
    for (auto& other : conns_)
      if (!other->dead && other->pending) try_answer(*other);
  }

  void expire_waits(Clock::time_point now) {
    for (auto& c : conns_) {
      if (c->dead || !c->pending || c->pending->deadline > now) continue;
      std::vector<std::string> missing;
      for (const auto& k : c->pending->keys)
        if (!data_.count(k)) missing.push_back(k);
      c->pending.reset();
      wire::FrameWriter w(static_cast<uint8_t>(Reply::Timeout));
      w.keys(missing);
      send(*c, w.finish());
    }
  }

  void reply(Connection& c, Reply status, const void* payload, size_t size) {
    wire::FrameWriter w(static_cast<uint8_t>(status), size);
    w.raw(payload, size);
    send(c, w.finish());
  }

  void send(Connection& c, std::vector<uint8_t> frame) {
    c.out = std::move(frame);
    c.out_sent = 0;
    flush(c);
  }

  // Writes what the socket takes now; the rest goes out on POLLOUT.
  static void flush(Connection& c) {
    while (c.out_sent < c.out.size()) {
      ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_sent, c.out.size() - c.out_sent, MSG_NOSIGNAL);
      if (n > 0) {
        c.out_sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      c.dead = true;
      return;
    }
    c.out.clear();
    c.out.shrink_to_fit();
    c.out_sent = 0;
  }

  std::vector<net::Fd> listeners_;  // one per address the store listens on
  net::Fd wake_read_;
  std::vector<std::unique_ptr<Connection>> conns_;
  std::unordered_map<std::string, std::vector<uint8_t>> data_;
  Clock::time_point accept_paused_until_{};
};

TcpStoreServer::TcpStoreServer(const std::string& host, int port) {
  std::vector<net::Fd> listeners = net::listen_on(host, port);
  port_ = net::local_port(listeners.front().get());
  int pipe_fds[2];
  EMBER_CHECK(::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) == 0, "TcpStore: cannot create the server's wake-up pipe: ",
              net::errno_text(errno));
  net::Fd wake_read(pipe_fds[0]);
  wake_write_ = net::Fd(pipe_fds[1]);
  loop_ = std::make_unique<Loop>(std::move(listeners), std::move(wake_read));
  thread_ = std::thread([loop = loop_.get()] { loop->run(); });
}

TcpStoreServer::~TcpStoreServer() {
  uint8_t byte = 1;
  while (::write(wake_write_.get(), &byte, 1) < 0 && errno == EINTR) {
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace ember::distributed
