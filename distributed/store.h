// Store: the key-value service ranks use to find each other (rendezvous) and to swap small
// blobs such as Gloo addresses or the NCCL unique id. Every blocking call honours timeout().
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ember::distributed {

using Bytes = std::vector<uint8_t>;

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Waits until `key` exists, then returns its value; past timeout() an ember::Error names the key.
  virtual Bytes get(const std::string& key) = 0;
  // Atomically adds `delta` to the integer stored at `key` (absent = 0) and returns the result.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // True when every key exists (no waiting).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits until every key exists; past the timeout an ember::Error lists the missing keys.
  virtual void wait(const std::vector<std::string>& keys) = 0;

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

  // Convenience for text values.
  void set_string(const std::string& key, const std::string& value) { set(key, Bytes(value.begin(), value.end())); }
  std::string get_string(const std::string& key) {
    Bytes b = get(key);
    return std::string(b.begin(), b.end());
  }

 protected:
  std::chrono::milliseconds timeout_{std::chrono::minutes(5)};
};

// Namespaces every key of an underlying store ("pg0/" + key), so several groups share one store.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
      : prefix_(std::move(prefix)), inner_(std::move(inner)) {
    timeout_ = inner_->timeout();
  }
  void set(const std::string& key, const Bytes& value) override { inner_->set(full(key), value); }
  Bytes get(const std::string& key) override { return inner_->get(full(key)); }
  int64_t add(const std::string& key, int64_t delta) override { return inner_->add(full(key), delta); }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(full(keys)); }
  void wait(const std::vector<std::string>& keys) override { inner_->wait(full(keys)); }
  const std::shared_ptr<Store>& inner() const { return inner_; }

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> full(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(full(k));
    return out;
  }
  std::string prefix_;
  std::shared_ptr<Store> inner_;
};

}  // namespace ember::distributed
