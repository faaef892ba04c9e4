// HashStore: an in-process Store (a map behind a mutex and a condition variable). Ranks that
// are threads of one process share one HashStore; tests use it to run a group without sockets
// for the rendezvous. Blocking calls honour timeout() like every Store.
#pragma once
#include <condition_variable>
#include <map>
#include <mutex>

#include "distributed/store.h"

namespace ember::distributed {

class HashStore : public Store {
 public:
  explicit HashStore(std::chrono::milliseconds timeout = std::chrono::minutes(5)) { timeout_ = timeout; }

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys) override;

 private:
  // Waits (lock held) until every key exists; throws naming `what` and the missing keys.
  void wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys, const char* what);

  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, Bytes> data_;
};

}  // namespace ember::distributed
