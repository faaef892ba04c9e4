// TcpStore: the Store every rank of a job reaches over TCP, like torch.distributed.TCPStore.
// Rank 0 constructs it with is_server=true: it starts the server thread (listening only on the
// address given, on every address a name resolves to) and talks to it through the same
// protocol as everyone else. The other ranks connect, retrying until timeout() since the
// server may start after them; a client still dialling after a few seconds says on stderr
// what it dials and why it waits, and again every half minute.
//
//   auto store = std::make_shared<TcpStore>("127.0.0.1", 29500, rank == 0, std::chrono::seconds(30));
//   store->set_string("addr/" + std::to_string(rank), my_address);
//   std::string peer = store->get_string("addr/0");   // waits on the server, no polling
//
// Keys are at most 4 KiB and values at most 64 MiB. Counters made by add() are stored as
// decimal text. Safe to use from several threads: each concurrent call gets its own connection.
#pragma once
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distributed/socket_util.h"
#include "distributed/store.h"

namespace ember::distributed {

class TcpStoreServer;

class TcpStore : public Store {
 public:
  // is_server: listen on host:port (port 0 picks a free port, see port()); "0.0.0.0" serves
  // other machines. Otherwise connect to host:port (a name or an address). `who` ("rank 1")
  // names this process in connection messages and errors.
  TcpStore(std::string host, int port, bool is_server,
           std::chrono::milliseconds timeout = std::chrono::minutes(5), std::string who = "");
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys) override;
  // How many keys the store holds.
  int64_t num_keys();

  // The actual port (the one chosen when constructed with port 0).
  int port() const { return port_; }
  // The address this store listens on (server) or connects to (client).
  const std::string& host() const { return host_; }
  bool is_server() const { return server_ != nullptr; }

 private:
  struct ReplyFrame;
  // Sends one request frame and returns the reply. `what` completes "was lost while ...".
  ReplyFrame call(const std::vector<uint8_t>& frame, const std::string& what,
                  std::chrono::milliseconds reply_within);
  net::Fd connect_new();
  net::Fd acquire();
  void release(net::Fd fd);
  std::string where() const;
  // where(), plus the addresses a name resolved to: "node0:29500 (10.0.0.5:29500)".
  std::string where_dialled(const std::vector<std::string>& addresses) const;

  std::unique_ptr<TcpStoreServer> server_;
  std::string host_;
  std::string connect_host_;  // host_, or loopback when the server listens on a wildcard
  int port_ = 0;
  std::string who_;
  // Set once a connection broke mid-call: the server is probably gone, so new connections get a
  // short try instead of the patient retry loop meant for a server that has yet to start.
  std::atomic<bool> lost_{false};
  std::mutex pool_mutex_;
  std::vector<net::Fd> idle_;  // connections not in use by a call
};

}  // namespace ember::distributed
