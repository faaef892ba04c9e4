#include "distributed/socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <sstream>
#include <thread>

#include "core/error.h"

namespace ember::distributed::net {

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r may return a static string instead of filling buf.
  const char* text = strerror_r(err, buf, sizeof(buf));
  return text ? std::string(text) : std::string("errno ") + std::to_string(err);
}

std::string format_seconds(std::chrono::milliseconds d) {
  std::ostringstream os;
  if (d.count() % 1000 == 0) {
    os << d.count() / 1000 << "s";
  } else {
    os << static_cast<double>(d.count()) / 1000.0 << "s";
  }
  return os.str();
}

std::string host_port(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

namespace {

struct AddrInfoDeleter {
  void operator()(addrinfo* p) const { freeaddrinfo(p); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

// Resolves host:port for TCP; returns nullptr and sets `error` on failure. `numeric_only`
// accepts address literals only (no lookup).
AddrInfoPtr resolve(const std::string& host, int port, bool passive, std::string& error,
                    bool numeric_only = false) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0) | (numeric_only ? AI_NUMERICHOST : 0);
  addrinfo* result = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) {
    error = "cannot resolve '" + host + "': " + (rc == EAI_SYSTEM ? errno_text(errno) : gai_strerror(rc));
    return nullptr;
  }
  return AddrInfoPtr(result);
}

bool is_loopback_sockaddr(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    uint32_t a = ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr);
    return (a >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
    return IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127;
  }
  return false;
}

bool all_loopback(const addrinfo* list) {
  for (const addrinfo* ai = list; ai; ai = ai->ai_next)
    if (!is_loopback_sockaddr(ai->ai_addr)) return false;
  return list != nullptr;
}

// "localhost" in any letter case, with or without the root's trailing dot.
bool is_localhost_name(const std::string& host) {
  std::string name = host;
  if (!name.empty() && name.back() == '.') name.pop_back();
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  return name == "localhost";
}

// The numeric address of a socket address, without the port ("?" for other families).
std::string address_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof(buf));
  else if (sa->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof(buf));
  return buf;
}

int sockaddr_port(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  if (sa->sa_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
  return 0;
}

std::string sockaddr_text(const sockaddr* sa) { return host_port(address_text(sa), sockaddr_port(sa)); }

// The distinct addresses of a resolver answer, in its order (a hosts file may repeat one).
std::vector<const addrinfo*> distinct_addresses(const addrinfo* list) {
  std::vector<const addrinfo*> out;
  for (const addrinfo* ai = list; ai; ai = ai->ai_next) {
    bool seen = std::any_of(out.begin(), out.end(), [&](const addrinfo* o) {
      return o->ai_addrlen == ai->ai_addrlen && std::memcmp(o->ai_addr, ai->ai_addr, ai->ai_addrlen) == 0;
    });
    if (!seen) out.push_back(ai);
  }
  return out;
}

// Milliseconds left until `deadline`, rounded up, clamped to [0, INT_MAX].
int poll_timeout_ms(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, INT_MAX));
}

// A socket connected to itself: possible when retrying connects to a free local port that
// lies in the ephemeral range (TCP simultaneous open).
bool connected_to_self(int fd) {
  sockaddr_storage local{}, peer{};
  socklen_t ll = sizeof(local), pl = sizeof(peer);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) return false;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) return false;
  return ll == pl && std::memcmp(&local, &peer, ll) == 0;
}

// One connect attempt to one address, waiting at most until `deadline`. On failure `error`
// holds the text and `code` the errno (ETIMEDOUT when the attempt itself ran out of time).
Fd connect_once(const addrinfo* ai, Clock::time_point deadline, std::string& error, int& code) {
  Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
  if (!fd.valid()) {
    code = errno;
    error = errno_text(code);
    return Fd();
  }
  if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS && errno != EINTR) {
      code = errno;
      error = errno_text(code);
      return Fd();
    }
    pollfd p{fd.get(), POLLOUT, 0};
    int rc;
    do {
      rc = ::poll(&p, 1, std::max(poll_timeout_ms(deadline), 1));
    } while (rc < 0 && errno == EINTR);
    if (rc == 0) {
      code = ETIMEDOUT;
      error = "connection attempt timed out";
      return Fd();
    }
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    if (rc < 0 || getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) so_error = errno;
    if (so_error != 0) {
      code = so_error;
      error = errno_text(so_error);
      return Fd();
    }
  }
  if (connected_to_self(fd.get())) {
    // Nothing listened: the retry met itself on a free port.
    code = ECONNREFUSED;
    error = errno_text(ECONNREFUSED);
    return Fd();
  }
  int one = 1;
  setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // Keepalive notices a peer machine that vanished without closing the connection.
  setsockopt(fd.get(), SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  return fd;
}

}  // namespace

std::vector<std::string> resolve_addresses(const std::string& host) {
  std::string error;
  AddrInfoPtr list = resolve(host, 0, false, error);
  std::vector<std::string> out;
  if (!list) return out;
  for (const addrinfo* ai : distinct_addresses(list.get())) out.push_back(address_text(ai->ai_addr));
  return out;
}

bool is_loopback_host(const std::string& host) {
  if (host.empty()) return false;
  if (is_localhost_name(host)) return true;
  std::string error;
  AddrInfoPtr list = resolve(host, 0, false, error);
  return list && all_loopback(list.get());
}

bool is_loopback_everywhere(const std::string& host) {
  if (host.empty()) return false;
  if (is_localhost_name(host)) return true;
  std::string error;
  AddrInfoPtr literal = resolve(host, 0, false, error, true);
  return literal && all_loopback(literal.get());
}

std::string local_address_toward(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (host.empty() || getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || !found) return "";
  AddrInfoPtr owned(found);
  for (const addrinfo* a = found; a; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) == 0)
      return address_text(reinterpret_cast<sockaddr*>(&local));
  }
  return "";
}

std::string routable_local_address() {
  // 192.0.2.1 (TEST-NET-1) is never local, so the kernel answers with the default route's source.
  std::string via_default = local_address_toward("192.0.2.1");
  if (!via_default.empty() && !is_loopback_host(via_default)) return via_default;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found, found_v6;
  for (const ifaddrs* i = list; i && found.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    if (i->ifa_addr->sa_family == AF_INET) {
      found = address_text(i->ifa_addr);
    } else if (i->ifa_addr->sa_family == AF_INET6 && found_v6.empty()) {
      const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr;
      // A link-local address needs its interface named to be dialled: useless to other ranks.
      if (!IN6_IS_ADDR_LINKLOCAL(&a) && !IN6_IS_ADDR_LOOPBACK(&a)) found_v6 = address_text(i->ifa_addr);
    }
  }
  freeifaddrs(list);
  return found.empty() ? found_v6 : found;
}

void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

namespace {

void set_port(sockaddr_storage& sa, int port) {
  if (sa.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&sa)->sin_port = htons(static_cast<uint16_t>(port));
  if (sa.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port = htons(static_cast<uint16_t>(port));
}

}  // namespace

std::vector<Fd> listen_on(const std::string& host, int port, int backlog) {
  EMBER_CHECK(port >= 0 && port <= 65535, "TcpStore: port ", port, " is out of range (0..65535)");
  std::string error;
  AddrInfoPtr list = resolve(host, port, true, error);
  EMBER_CHECK(list, "TcpStore: cannot listen on ", host_port(host, port), ": ", error);
  const std::vector<const addrinfo*> addresses = distinct_addresses(list.get());
  const bool has_v4 =
      std::any_of(addresses.begin(), addresses.end(), [](const addrinfo* a) { return a->ai_family == AF_INET; });
  auto in_use = [&] {
    EMBER_FAIL("TcpStore: port ", port, " on ", host,
               " is already in use (is another job running? set MASTER_PORT)");
  };
  // With port 0 the first address picks the port and the others must get the same one; when
  // another program holds it there, start over with a new port.
  constexpr int kPortAttempts = 16;
  for (int attempt = 1;; ++attempt) {
    std::vector<Fd> fds;
    int bound_port = port;
    bool start_over = false;
    for (const addrinfo* ai : addresses) {
      Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
      if (!fd.valid()) {
        error = errno_text(errno);  // e.g. no IPv6 on this machine: the other addresses may do
        continue;
      }
      // SO_REUSEADDR lets a restarted job reuse a port whose old connections linger in
      // TIME_WAIT; on Linux a port with an active listener still refuses the bind.
      int one = 1;
      setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      // The IPv4 addresses get sockets of their own; a dual-stack IPv6 one would collide with them.
      if (ai->ai_family == AF_INET6 && has_v4) setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
      sockaddr_storage sa{};
      std::memcpy(&sa, ai->ai_addr, ai->ai_addrlen);
      set_port(sa, bound_port);
      if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), ai->ai_addrlen) != 0 ||
          ::listen(fd.get(), backlog) != 0) {
        const int err = errno;
        if (err == EADDRINUSE && port == 0 && !fds.empty() && attempt < kPortAttempts) {
          start_over = true;
          break;
        }
        if (err == EADDRINUSE) in_use();
        error = address_text(ai->ai_addr) + ": " + errno_text(err);
        continue;
      }
      if (bound_port == 0) bound_port = local_port(fd.get());
      fds.push_back(std::move(fd));
    }
    if (start_over) continue;
    EMBER_CHECK(!fds.empty(), "TcpStore: cannot listen on ", host_port(host, port), ": ", error);
    return fds;
  }
}

int local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  EMBER_CHECK(getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0,
              "TcpStore: getsockname failed: ", errno_text(errno));
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
}

std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return sockaddr_text(reinterpret_cast<sockaddr*>(&ss));
}

Fd connect_until(const std::string& host, int port, Clock::time_point deadline, std::string& last_error,
                 const std::function<void(const DialProgress&)>& after_failed_round) {
  const auto start = Clock::now();
  auto backoff = std::chrono::milliseconds(10);
  while (true) {
    AddrInfoPtr list = resolve(host, port, false, last_error);
    DialProgress progress;
    progress.refused = list != nullptr;
    for (const addrinfo* ai : distinct_addresses(list.get())) {
      int code = 0;
      Fd fd = connect_once(ai, deadline, last_error, code);
      if (fd.valid()) return fd;
      progress.addresses.push_back(sockaddr_text(ai->ai_addr));
      progress.refused = progress.refused && code == ECONNREFUSED;
    }
    auto now = Clock::now();
    if (after_failed_round) {
      progress.waited = now - start;
      progress.error = last_error;
      after_failed_round(progress);
    }
    if (now >= deadline) return Fd();
    // The server may not be listening yet: back off and try again.
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

IoStatus send_all(int fd, const void* data, size_t size, Clock::time_point deadline, int& err) {
  const auto* p = static_cast<const uint8_t*>(data);
  err = 0;
  while (size > 0) {
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int wait_ms = poll_timeout_ms(deadline);
      if (wait_ms == 0) return IoStatus::Timeout;
      pollfd pfd{fd, POLLOUT, 0};
      if (::poll(&pfd, 1, wait_ms) < 0 && errno != EINTR) {
        err = errno;
        return IoStatus::Closed;
      }
      continue;
    }
    err = n < 0 ? errno : 0;
    return IoStatus::Closed;
  }
  return IoStatus::Ok;
}

IoStatus recv_exact(int fd, void* data, size_t size, Clock::time_point deadline, int& err) {
  auto* p = static_cast<uint8_t*>(data);
  err = 0;
  while (size > 0) {
    ssize_t n = ::recv(fd, p, size, 0);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return IoStatus::Closed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int wait_ms = poll_timeout_ms(deadline);
      if (wait_ms == 0) return IoStatus::Timeout;
      pollfd pfd{fd, POLLIN, 0};
      if (::poll(&pfd, 1, wait_ms) < 0 && errno != EINTR) {
        err = errno;
        return IoStatus::Closed;
      }
      continue;
    }
    err = errno;
    return IoStatus::Closed;
  }
  return IoStatus::Ok;
}

}  // namespace ember::distributed::net
