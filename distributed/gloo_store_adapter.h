// Lets Gloo's rendezvous (gloo::rendezvous::Context::connectFullMesh) talk to an Ember Store.
#pragma once
#include <gloo/rendezvous/store.h>

#include <memory>

#include "distributed/store.h"

namespace ember::distributed {

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  explicit GlooStoreAdapter(std::shared_ptr<distributed::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  // Waits at most `timeout` (polling check(), so the shared store's own timeout is left alone);
  // past it an ember::Error lists the missing keys.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<distributed::Store> store_;
};

// Polls `store` until every key exists or `timeout` passes; returns the keys still missing.
std::vector<std::string> wait_for_keys(Store& store, const std::vector<std::string>& keys,
                                       std::chrono::milliseconds timeout);

}  // namespace ember::distributed
