#include "distributed/rendezvous.h"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
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

// When rank 0 first says who it still waits for at the barrier, and how often after that.
constexpr std::chrono::seconds kFirstBarrierNotice{5};
constexpr std::chrono::seconds kBarrierNoticeEvery{30};

std::vector<int> missing_ranks(Store& store, const std::vector<std::string>& keys) {
  std::vector<int> missing;
  for (size_t r = 0; r < keys.size(); ++r)
    if (!store.check({keys[r]})) missing.push_back(static_cast<int>(r));
  return missing;
}

// "1, 3", or the first 16 and how many more.
std::string rank_list(const std::vector<int>& ranks) {
  constexpr size_t kShown = 16;
  std::string list;
  for (size_t i = 0; i < ranks.size() && i < kShown; ++i) list += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > kShown) list += ", ... (" + std::to_string(ranks.size() - kShown) + " more)";
  return list;
}

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
  // The ranks dial MASTER_ADDR, so a loopback master is served on exactly the addresses it
  // resolves to (127.0.1.1 for Debian's host name, ::1 and 127.0.0.1 for "localhost"), and
  // nothing is exposed to the network. A name that is loopback only by this machine's
  // resolver may mean a routable address to the other machines of a job: serve them all.
  if (net::is_loopback_everywhere(info.master_addr) ||
      (info.num_nodes() == 1 && net::is_loopback_host(info.master_addr)))
    return info.master_addr;
  in6_addr a6{};
  return inet_pton(AF_INET6, info.master_addr.c_str(), &a6) == 1 ? "::" : "0.0.0.0";
}

std::shared_ptr<Store> connect_store(const RendezvousInfo& info, std::chrono::milliseconds timeout) {
  const std::string who = "rank " + std::to_string(info.rank);
  if (info.rank == 0)
    return std::make_shared<TcpStore>(store_bind_address(info), info.master_port, true, timeout, who);
  return std::make_shared<TcpStore>(info.master_addr, info.master_port, false, timeout, who);
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
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  // Rank 0 waits in slices so that, while ranks are missing, it says which ones: a rank that
  // dials a wrong address never arrives, and silence until the timeout tells the user nothing.
  auto notice_at = std::chrono::duration_cast<std::chrono::milliseconds>(kFirstBarrierNotice);
  while (true) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    if (waited >= timeout) break;
    const auto slice = rank == 0 ? std::min(timeout - waited, notice_at - waited) : timeout - waited;
    store.set_timeout(std::max(slice, std::chrono::milliseconds(1)));
    const auto slice_start = Clock::now();
    try {
      store.wait(keys);
      return;
    } catch (const Error&) {
      // Only a timeout leads on to naming the missing ranks; an earlier failure (the store
      // went away) is the real story.
      if (Clock::now() - slice_start < slice) throw;
    }
    if (Clock::now() - start >= timeout) break;
    const std::vector<int> missing = missing_ranks(store, keys);
    if (missing.empty()) return;
    const std::string who = (missing.size() == 1 ? "rank " : "ranks ") + rank_list(missing);
    const auto so_far = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start);
    std::fprintf(stderr,
                 "rendezvous: rank 0 has waited %s for %s (%d of %d arrived); waiting until the timeout of %s\n",
                 net::format_seconds(so_far).c_str(), who.c_str(), world_size - int(missing.size()), world_size,
                 net::format_seconds(timeout).c_str());
    std::fflush(stderr);
    notice_at += std::chrono::duration_cast<std::chrono::milliseconds>(kBarrierNoticeEvery);
  }
  const std::vector<int> missing = missing_ranks(store, keys);
  if (missing.empty()) return;  // the last rank arrived just after the wait gave up
  EMBER_FAIL("rendezvous: only ", world_size - static_cast<int>(missing.size()), " of ", world_size,
             " ranks arrived within ", net::format_seconds(timeout), " (missing ranks: ", rank_list(missing), ")");
}

std::shared_ptr<Store> rendezvous(const RendezvousInfo& info, std::chrono::milliseconds timeout) {
  std::shared_ptr<Store> store = connect_store(info, timeout);
  rendezvous_barrier(*store, info.rank, info.world_size, timeout);
  return store;
}

}  // namespace ember::distributed
