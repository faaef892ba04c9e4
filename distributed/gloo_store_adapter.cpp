#include "distributed/gloo_store_adapter.h"

#include <algorithm>
#include <thread>

#include "core/error.h"

namespace ember::distributed {

std::vector<std::string> wait_for_keys(Store& store, const std::vector<std::string>& keys,
                                       std::chrono::milliseconds timeout) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + timeout;
  std::vector<std::string> missing = keys;
  auto pause = std::chrono::microseconds(200);
  for (;;) {
    std::vector<std::string> still;
    for (const auto& k : missing)
      if (!store.check({k})) still.push_back(k);
    missing.swap(still);
    if (missing.empty() || clock::now() >= deadline) return missing;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20000));  // quick first, gentle later
  }
}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_->set(key, Bytes(data.begin(), data.end()));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  Bytes b = store_->get(key);
  return std::vector<char>(b.begin(), b.end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) { store_->wait(keys); }

void GlooStoreAdapter::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  const auto missing = wait_for_keys(*store_, keys, timeout);
  if (missing.empty()) return;
  std::string list;
  for (const auto& k : missing) list += (list.empty() ? "'" : ", '") + k + "'";
  EMBER_FAIL("store: timed out after ", timeout.count(), " ms waiting for key(s) ", list);
}

}  // namespace ember::distributed
