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
