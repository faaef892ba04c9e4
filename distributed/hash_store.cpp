#include "distributed/hash_store.h"

#include <string>

#include "core/error.h"

namespace ember::distributed {

void HashStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = value;
  }
  changed_.notify_all();
}

Bytes HashStore::get(const std::string& key) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_locked(lock, {key}, "get");
  return data_.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    int64_t current = 0;
    if (it != data_.end()) {
      const std::string text(it->second.begin(), it->second.end());
      try {
        size_t used = 0;
        current = std::stoll(text, &used);
        EMBER_CHECK(used == text.size(), "HashStore::add: key '", key, "' holds '", text, "', not an integer");
      } catch (const std::logic_error&) {
        EMBER_FAIL("HashStore::add: key '", key, "' holds '", text, "', not an integer");
      }
    }
    result = current + delta;
    const std::string text = std::to_string(result);
    data_[key] = Bytes(text.begin(), text.end());
  }
  changed_.notify_all();
  return result;
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& k : keys)
    if (!data_.count(k)) return false;
  return true;
}

void HashStore::wait(const std::vector<std::string>& keys) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_locked(lock, keys, "wait");
}

void HashStore::wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                            const char* what) {
  auto all_present = [&] {
    for (const auto& k : keys)
      if (!data_.count(k)) return false;
    return true;
  };
  if (changed_.wait_for(lock, timeout_, all_present)) return;
  std::string missing;
  for (const auto& k : keys)
    if (!data_.count(k)) missing += (missing.empty() ? "'" : ", '") + k + "'";
  EMBER_FAIL("HashStore::", what, ": timed out after ", timeout_.count(), " ms waiting for key(s) ", missing);
}

}  // namespace ember::distributed
