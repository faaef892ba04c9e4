#include "distributed/rendezvous.h"

#include <arpa/inet.h>

#include <charconv>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "distributed/socket_util.h"
#include "distributed/tcp_store.h"

namespace ember::distributed {

namespace {

using Lookup = std::function<std::optional<std::string>(const std::string&)>;

int parse_int(const std::string& name, const std::string& value) {
  int out = 0;
  const char* first = value.data();
  const char* last = first + value.size();
  auto [ptr, ec] = std::from_chars(first, last, out);
  EMBER_CHECK(ec == std::errc() && ptr == last && first != last, "rendezvous: ", name, "='", value,
              "' is not an integer");
  return out;
}

// Both variables of a pair, or neither; one alone is an error naming both.
bool pair_set(const Lookup& lookup, const std::string& a, const std::string& b) {
  auto va = lookup(a), vb = lookup(b);
  if (va.has_value() != vb.has_value()) {
    const std::string& set = va ? a : b;
    const std::string& unset = va ? b : a;
    EMBER_FAIL("rendezvous: ", set, "='", va ? *va : *vb, "' is set but ", unset, " is not (", a, " and ", b,
               " go together, as `ember launch` and torchrun set them)");
  }
  return va.has_value();
}

class TimeoutOverride {
 public:
  TimeoutOverride(Store& store, std::chrono::milliseconds t) : store_(store), saved_(store.timeout()) {
    store_.set_timeout(t);
  }
  ~TimeoutOverride() { store_.set_timeout(saved_); }

 private:
  Store& store_;
  std::chrono::milliseconds saved_;
};

std::string arrival_key(const std::string& name, int rank) { return name + "/rank_" + std::to_string(rank); }

}  // namespace

RendezvousInfo rendezvous_info_from(const Lookup& lookup) {
  RendezvousInfo info;
  bool have_ranks = pair_set(lookup, "RANK", "WORLD_SIZE");
  bool have_local = pair_set(lookup, "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  if (have_ranks) {
    info.world_size = parse_int("WORLD_SIZE", *lookup("WORLD_SIZE"));
    info.rank = parse_int("RANK", *lookup("RANK"));
    EMBER_CHECK(info.world_size >= 1, "rendezvous: WORLD_SIZE='", info.world_size, "' must be at least 1");
    EMBER_CHECK(info.rank >= 0 && info.rank < info.world_size, "rendezvous: RANK='", info.rank,
                "' is out of range for WORLD_SIZE=", info.world_size, " (0..", info.world_size - 1, ")");
  } else if (have_local) {
    EMBER_FAIL("rendezvous: LOCAL_RANK='", *lookup("LOCAL_RANK"),
               "' is set but RANK and WORLD_SIZE are not (set all of them, or none for a single process)");
  }

  if (have_local) {
    info.local_world_size = parse_int("LOCAL_WORLD_SIZE", *lookup("LOCAL_WORLD_SIZE"));
    info.local_rank = parse_int("LOCAL_RANK", *lookup("LOCAL_RANK"));
    EMBER_CHECK(info.local_world_size >= 1 && info.local_world_size <= info.world_size,
                "rendezvous: LOCAL_WORLD_SIZE='", info.local_world_size, "' must be in 1..WORLD_SIZE=",
                info.world_size);
    EMBER_CHECK(info.local_rank >= 0 && info.local_rank < info.local_world_size, "rendezvous: LOCAL_RANK='",
                info.local_rank, "' is out of range for LOCAL_WORLD_SIZE=", info.local_world_size, " (0..",
                info.local_world_size - 1, ")");
  } else {
    // No launcher told us about machines: all ranks share this one.
    info.local_world_size = info.world_size;
    info.local_rank = info.rank;
  }

  auto addr = lookup("MASTER_ADDR");
  auto port = lookup("MASTER_PORT");
  if (info.world_size > 1) {
    EMBER_CHECK(addr, "rendezvous: WORLD_SIZE=", info.world_size,
                " but MASTER_ADDR is not set (the address of the machine running rank 0)");
    EMBER_CHECK(port, "rendezvous: WORLD_SIZE=", info.world_size,
                " but MASTER_PORT is not set (a free port on the machine running rank 0)");
  }
  if (addr) {
    EMBER_CHECK(!addr->empty(), "rendezvous: MASTER_ADDR is set but empty");
    info.master_addr = *addr;
  }
  if (port) {
    int p = parse_int("MASTER_PORT", *port);
    EMBER_CHECK(p >= 1 && p <= 65535, "rendezvous: MASTER_PORT='", *port, "' is not a port number (1..65535)");
    info.master_port = p;
  }
  return info;
}

RendezvousInfo rendezvous_info_from_env() {
  return rendezvous_info_from([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  });
}

std::string store_bind_address(const RendezvousInfo& info) {
  if (const char* bind = std::getenv("EMBER_STORE_BIND_ADDR"); bind && *bind) return bind;
  if (net::is_loopback_host(info.master_addr)) {
    in6_addr a6{};
    return inet_pton(AF_INET6, info.master_addr.c_str(), &a6) == 1 ? "::1" : "127.0.0.1";
  }
  return "0.0.0.0";
}

std::shared_ptr<Store> connect_store(const RendezvousInfo& info, std::chrono::milliseconds timeout) {
  if (info.rank == 0) return std::make_shared<TcpStore>(store_bind_address(info), info.master_port, true, timeout);
  return std::make_shared<TcpStore>(info.master_addr, info.master_port, false, timeout);
}

void rendezvous_barrier(Store& store, int rank, int world_size, std::chrono::milliseconds timeout,
                        const std::string& name) {
  EMBER_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "rendezvous: rank ", rank,
              " is out of range for world size ", world_size);
  store.set_string(arrival_key(name, rank), "1");
  store.add(name, 1);

  std::vector<std::string> keys;
  keys.reserve(world_size);
  for (int r = 0; r < world_size; ++r) keys.push_back(arrival_key(name, r));
  TimeoutOverride guard(store, timeout);
  auto start = std::chrono::steady_clock::now();
  try {
    store.wait(keys);
    return;
  } catch (const Error&) {
    // Only a timeout leads on to naming the missing ranks; an earlier failure (the store
    // went away) is the real story.
    if (std::chrono::steady_clock::now() - start < timeout) throw;
  }
  std::vector<int> missing;
  for (int r = 0; r < world_size; ++r)
    if (!store.check({keys[r]})) missing.push_back(r);
  if (missing.empty()) return;  // the last rank arrived just after the wait gave up

  std::string list;
  constexpr size_t kShown = 16;
  for (size_t i = 0; i < missing.size() && i < kShown; ++i) list += (i ? ", " : "") + std::to_string(missing[i]);
  if (missing.size() > kShown) list += ", ... (" + std::to_string(missing.size() - kShown) + " more)";
  EMBER_FAIL("rendezvous: only ", world_size - static_cast<int>(missing.size()), " of ", world_size,
             " ranks arrived within ", net::format_seconds(timeout), " (missing ranks: ", list, ")");
}

std::shared_ptr<Store> rendezvous(const RendezvousInfo& info, std::chrono::milliseconds timeout) {
  std::shared_ptr<Store> store = connect_store(info, timeout);
  rendezvous_barrier(*store, info.rank, info.world_size, timeout);
  return store;
}

}  // namespace ember::distributed
