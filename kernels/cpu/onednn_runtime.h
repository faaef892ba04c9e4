// What the CPU kernels that call oneDNN primitives share: the process's engine, each thread's
// stream and scratchpad, the OpenMP thread count a primitive is created and run under, and a
// bounded cache of created primitives (creating one costs far more than running it).
#pragma once
#include <dnnl.hpp>

#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace ember::cpu {

// One CPU engine for the process (primitives run only on streams of the engine that created
// them). Never destroyed: pool threads may still hold streams on it at exit.
const dnnl::engine& onednn_engine();
// The calling thread's stream on that engine.
dnnl::stream& onednn_thread_stream();
// The calling thread's scratch memory for primitives in user scratchpad mode (so one primitive
// can run on several threads at once), grown as needed, 64-byte aligned.
void* onednn_thread_scratchpad(size_t bytes);

// Sets OpenMP's thread count on this thread for the lifetime of the guard (oneDNN sizes its
// work split at primitive creation and runs it at execution; both must see the same count).
class OmpThreads {
 public:
  explicit OmpThreads(int threads);
  ~OmpThreads();
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int previous_, threads_;
};

// Created primitives by key, the least recently used dropped beyond `capacity`. Thread-safe;
// a value is created under the lock, so threads asking for one key share one creation.
template <class Key, class Value, class Hash>
class PrimitiveCache {
 public:
  explicit PrimitiveCache(size_t capacity) : capacity_(capacity) {}
  std::shared_ptr<const Value> get(const Key& key, const std::function<Value(const Key&)>& create) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = index_.find(key); it != index_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return it->second->second;
    }
    auto made = std::make_shared<const Value>(create(key));
    order_.emplace_front(key, made);
    index_[key] = order_.begin();
    if (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();  // a thread running it still holds its own reference
    }
    return made;
  }

 private:
  using Entry = std::pair<Key, std::shared_ptr<const Value>>;
  size_t capacity_;
  std::mutex mutex_;
  std::list<Entry> order_;  // most recently used first
  std::unordered_map<Key, typename std::list<Entry>::iterator, Hash> index_;
};

}  // namespace ember::cpu
