// The server half of TcpStore: one thread that owns the key-value map and serves every client
// connection through poll(). Requests that must wait (get of a missing key, wait) are parked on
// the server and answered when the keys appear or their deadline passes, so clients never poll.
// A client that sends anything malformed or oversized loses its connection; the server and the
// other clients carry on.
#pragma once
#include <memory>
#include <string>
#include <thread>

#include "distributed/socket_util.h"

namespace ember::distributed {

class TcpStoreServer {
 public:
  // Binds and listens on host:port (port 0 = a free port) before returning, on every address
  // `host` resolves to (one port for all); throws ember::Error when the port is taken.
  TcpStoreServer(const std::string& host, int port);
  // Stops the thread, closing every client connection (their waits fail instead of hanging).
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }

  class Loop;  // the poll loop and its state, private to the .cpp

 private:
  int port_ = 0;
  net::Fd wake_write_;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
};

}  // namespace ember::distributed
