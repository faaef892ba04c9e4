#include "distributed/socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
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

// Resolves host:port for TCP; returns nullptr and sets `error` on failure.
AddrInfoPtr resolve(const std::string& host, int port, bool passive, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
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

std::string sockaddr_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    port = ntohs(in->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
    port = ntohs(in6->sin6_port);
  }
  return host_port(buf, port);
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

// One connect attempt to one address, waiting at most until `deadline`.
Fd connect_once(const addrinfo* ai, Clock::time_point deadline, std::string& error) {
  Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
  if (!fd.valid()) {
    error = errno_text(errno);
    return Fd();
  }
  if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS && errno != EINTR) {
      error = errno_text(errno);
      return Fd();
    }
    pollfd p{fd.get(), POLLOUT, 0};
    int rc;
    do {
      rc = ::poll(&p, 1, std::max(poll_timeout_ms(deadline), 1));
    } while (rc < 0 && errno == EINTR);
    if (rc == 0) {
      error = "connection attempt timed out";
      return Fd();
    }
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    if (rc < 0 || getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) so_error = errno;
    if (so_error != 0) {
      error = errno_text(so_error);
      return Fd();
    }
  }
  if (connected_to_self(fd.get())) {
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

bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  in_addr a4{};
  if (inet_pton(AF_INET, host.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6{};
  if (inet_pton(AF_INET6, host.c_str(), &a6) == 1) {
    sockaddr_in6 sa{};
    sa.sin6_family = AF_INET6;
    sa.sin6_addr = a6;
    return is_loopback_sockaddr(reinterpret_cast<sockaddr*>(&sa));
  }
  std::string error;
  AddrInfoPtr list = resolve(host, 0, false, error);
  if (!list) return false;
  for (const addrinfo* ai = list.get(); ai; ai = ai->ai_next)
    if (!is_loopback_sockaddr(ai->ai_addr)) return false;
  return true;
}

void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

Fd listen_on(const std::string& host, int port, int backlog) {
  EMBER_CHECK(port >= 0 && port <= 65535, "TcpStore: port ", port, " is out of range (0..65535)");
  std::string error;
  AddrInfoPtr list = resolve(host, port, true, error);
  EMBER_CHECK(list, "TcpStore: cannot listen on ", host_port(host, port), ": ", error);
  auto in_use = [&] {
    EMBER_FAIL("TcpStore: port ", port, " on ", host,
               " is already in use (is another job running? set MASTER_PORT)");
  };
  for (const addrinfo* ai = list.get(); ai; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      error = errno_text(errno);
      continue;
    }
    // SO_REUSEADDR lets a restarted job reuse a port whose old connections linger in
    // TIME_WAIT; on Linux a port with an active listener still refuses the bind.
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno == EADDRINUSE) in_use();
      error = errno_text(errno);
      continue;
    }
    if (::listen(fd.get(), backlog) != 0) {
      if (errno == EADDRINUSE) in_use();
      error = errno_text(errno);
      continue;
    }
    return fd;
  }
  EMBER_FAIL("TcpStore: cannot listen on ", host_port(host, port), ": ", error);
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

Fd connect_until(const std::string& host, int port, Clock::time_point deadline, std::string& last_error) {
  auto backoff = std::chrono::milliseconds(10);
  while (true) {
    AddrInfoPtr list = resolve(host, port, false, last_error);
    for (const addrinfo* ai = list.get(); ai; ai = ai->ai_next) {
      Fd fd = connect_once(ai, deadline, last_error);
      if (fd.valid()) return fd;
    }
    auto now = Clock::now();
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
