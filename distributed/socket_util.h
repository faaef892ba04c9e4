// Small POSIX TCP helpers for the store, the rendezvous and the Gloo group: an owning file
// descriptor, the one set of rules for which hosts are loopback, listening and connecting with
// deadlines, and exact-length send/receive on non-blocking sockets. Everything reports
// failures through return values or ember::Error with the errno text, never through signals
// (SIGPIPE is suppressed per send).
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ember::distributed::net {

using Clock = std::chrono::steady_clock;

// Owns one file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.release();
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

// strerror text for an errno value.
std::string errno_text(int err);

// "1.5s", "30s", "0.3s": durations as they appear in error messages.
std::string format_seconds(std::chrono::milliseconds d);

// "HOST:PORT", with brackets around IPv6 literals.
std::string host_port(const std::string& host, int port);

// Every address `host` resolves to for TCP, as numeric text ("127.0.1.1", "::1") in the order
// a client tries them, without repeats. Empty when the name does not resolve.
std::vector<std::string> resolve_addresses(const std::string& host);

// True when `host` names only loopback addresses: an address in 127.0.0.0/8, the IPv6 loopback
// (or 127.x.y.z mapped into IPv6), "localhost", or a name that resolves to loopback addresses only, such as
// the machine's own host name, which Debian maps to 127.0.1.1. Empty or unresolvable: false.
bool is_loopback_host(const std::string& host);

// True when `host` is loopback on every machine: a loopback address literal or "localhost".
// A name that is loopback only by this machine's resolver (its host name in /etc/hosts) may
// name a routable address on the other machines of a job.
bool is_loopback_everywhere(const std::string& host);

// The local address the kernel would send from to reach `host` (a UDP connect sends nothing);
// empty when `host` does not resolve or has no route.
std::string local_address_toward(const std::string& host);

// An address of this machine that other machines can reach: the source address of the default
// route, else the first non-loopback address of an interface that is up. Empty when the
// machine has none.
std::string routable_local_address();

void set_nonblocking(int fd);

// Listening, non-blocking TCP sockets on every address `host` resolves to, all on one port
// (port 0 = a free port), so a client reaches them whichever of the addresses it dials.
// Addresses this machine cannot bind (IPv6 turned off) are skipped while one remains. Throws
// ember::Error; an address in use gets a message that tells the user what to change.
std::vector<Fd> listen_on(const std::string& host, int port, int backlog = 128);
// The local port of a bound socket.
int local_port(int fd);
// "ADDR:PORT" of the peer of a connected socket ("?" when unknown).
std::string peer_name(int fd);

// Where a dial that keeps failing stands, after each round over the host's addresses.
struct DialProgress {
  Clock::duration waited{};            // since the first attempt
  std::vector<std::string> addresses;  // "ADDR:PORT" dialled this round; empty: did not resolve
  std::string error;                   // the last attempt's error text
  bool refused = false;                // every address refused: nothing listens there (yet)
};

// Connects to host:port, retrying refused or unreachable attempts (the server may start later)
// until `deadline`. Returns a connected non-blocking socket with TCP_NODELAY; on failure returns
// an invalid Fd and stores the last error text in `last_error`. `after_failed_round`, when
// given, hears about every round that did not connect (to tell a waiting user why).
Fd connect_until(const std::string& host, int port, Clock::time_point deadline, std::string& last_error,
                 const std::function<void(const DialProgress&)>& after_failed_round = nullptr);

enum class IoStatus { Ok, Timeout, Closed };

// Sends all of `data` before `deadline`. Closed covers a reset or a peer that went away
// (`err` holds errno, 0 for an orderly close).
IoStatus send_all(int fd, const void* data, size_t size, Clock::time_point deadline, int& err);
// Receives exactly `size` bytes before `deadline`.
IoStatus recv_exact(int fd, void* data, size_t size, Clock::time_point deadline, int& err);

// Little-endian fixed-width integers for wire formats.
inline void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
inline void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace ember::distributed::net
