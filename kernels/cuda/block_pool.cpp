#include "kernels/cuda/block_pool.h"

#include <algorithm>
#include <functional>
#include <tuple>

namespace ember::cuda {

bool BlockPool::Order::operator()(const Block* a, const Block* b) const {
  // std::less gives a total order on unrelated pointers, where < does not.
  if (a->stream != b->stream) return std::less<void*>()(a->stream, b->stream);
  if (a->size != b->size) return a->size < b->size;
  return std::less<char*>()(a->ptr, b->ptr);
}

BlockPool::~BlockPool() {
  for (Block* b : small_free_) delete b;
  for (Block* b : large_free_) delete b;
  for (auto& [ptr, b] : live_) delete b;
  for (Pending& p : pending_) delete p.block;
}

size_t BlockPool::round_size(size_t nbytes) {
  if (nbytes == 0) return kRound;
  return (nbytes + kRound - 1) / kRound * kRound;
}

size_t BlockPool::segment_size(size_t rounded) {
  if (rounded <= kSmallRequest) return kSmallSegment;
  if (rounded <= kMediumRequest) return kMediumSegment;
  return (rounded + kSegmentRound - 1) / kSegmentRound * kSegmentRound;
}

BlockPool::Block* BlockPool::take_free_block(size_t size, void* stream, bool small) {
  auto& set = free_set(small);
  Block key{nullptr, size, stream, small, false, nullptr, nullptr, {}};
  auto it = set.lower_bound(&key);
  if (it == set.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  set.erase(it);
  return b;
}

BlockPool::Block* BlockPool::new_segment(size_t size, void* stream, bool small) {
  const size_t seg = segment_size(size);
  void* p = backend_.raw_alloc(seg);
  if (!p) {
    release_cached();
    p = backend_.raw_alloc(seg);
    if (!p) return nullptr;
  }
  stats_.bytes_reserved += int64_t(seg);
  ++segments_;
  return new Block{static_cast<char*>(p), seg, stream, small, false, nullptr, nullptr, {}};
}

void BlockPool::split(Block* b, size_t size) {
  const size_t rest = b->size - size;
  // A small block splits down to the rounding unit; a large one only when the rest is itself
  // a large request, so large segments are not shredded into pieces nobody can use.
  const bool worth = b->small ? rest >= kRound : rest > kSmallRequest;
  if (!worth) return;
  Block* r = new Block{b->ptr + size, rest, b->stream, b->small, false, nullptr, nullptr, {}};
  r->prev = b;
  r->next = b->next;
  if (b->next) b->next->prev = r;
  b->next = r;
  b->size = size;
  free_set(r->small).insert(r);
}

void* BlockPool::allocate(size_t nbytes, void* stream) {
  process_pending();
  const size_t size = round_size(nbytes);
  const bool small = size <= kSmallRequest;
  ++stats_.num_allocations;
  Block* b = take_free_block(size, stream, small);
  if (b) {
    ++stats_.num_cache_hits;
  } else {
    b = new_segment(size, stream, small);
    if (!b) {
      --stats_.num_allocations;
      return nullptr;
    }
  }
  split(b, size);
  b->allocated = true;
  live_[b->ptr] = b;
  stats_.bytes_in_use += int64_t(b->size);
  stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
  return b->ptr;
}

bool BlockPool::free(void* ptr) {
  auto it = live_.find(ptr);
  if (it == live_.end()) return false;
  Block* b = it->second;
  live_.erase(it);
  b->allocated = false;
  stats_.bytes_in_use -= int64_t(b->size);
  if (b->other_streams.empty()) {
    return_block(b);
    return true;
  }
  Pending p{b, {}};
  for (void* s : b->other_streams) p.events.push_back(backend_.record_event(s));
  b->other_streams.clear();
  pending_.push_back(std::move(p));
  return true;
}

bool BlockPool::record_stream(void* ptr, void* stream) {
  auto it = live_.find(ptr);
  if (it == live_.end()) return false;
  Block* b = it->second;
  if (stream != b->stream && std::find(b->other_streams.begin(), b->other_streams.end(), stream) ==
                                 b->other_streams.end())
    b->other_streams.push_back(stream);
  return true;
}

void BlockPool::return_block(Block* b) {
  auto& set = free_set(b->small);
  // A neighbour can be merged only when free and not waiting on events: pending blocks are in
  // neither live_ nor the free set, so membership of the free set is the test.
  if (b->prev && !b->prev->allocated && set.count(b->prev)) {
    Block* p = b->prev;
    set.erase(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    delete b;
    b = p;
  }
  if (b->next && !b->next->allocated && set.count(b->next)) {
    Block* n = b->next;
    set.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    delete n;
  }
  set.insert(b);
}

void BlockPool::process_pending() {
  if (pending_.empty()) return;
  std::vector<Pending> still;
  for (Pending& p : pending_) {
    const bool done = std::all_of(p.events.begin(), p.events.end(), [&](void* e) { return backend_.event_done(e); });
    if (!done) {
      still.push_back(std::move(p));
      continue;
    }
    for (void* e : p.events) backend_.destroy_event(e);
    return_block(p.block);
  }
  pending_ = std::move(still);
}

void BlockPool::release_cached() {
  process_pending();
  for (bool small : {true, false}) {
    auto& set = free_set(small);
    for (auto it = set.begin(); it != set.end();) {
      Block* b = *it;
      if (b->prev || b->next) {  // part of a segment still in use
        ++it;
        continue;
      }
      it = set.erase(it);
      backend_.raw_free(b->ptr);
      stats_.bytes_reserved -= int64_t(b->size);
      --segments_;
      delete b;
    }
  }
}

}  // namespace ember::cuda
