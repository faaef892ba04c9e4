#include "kernels/cuda/block_pool.h"

#include <algorithm>
#include <functional>
#include <memory>
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
  for (Block* list : {pending_, lost_}) {
    while (Block* b = list) {
      list = b->next_waiting;
      delete b;
    }
  }
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

BlockPool::FreeSet::node_type BlockPool::make_node(Block* b) {
  FreeSet one;
  one.insert(b);
  return one.extract(one.begin());
}

BlockPool::Block* BlockPool::take_free_block(size_t size, void* stream, bool small) {
  auto& set = free_set(small);
  Block key{.ptr = nullptr, .size = size, .stream = stream, .small = small};
  auto it = set.lower_bound(&key);
  if (it == set.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  b->node = set.extract(it);  // kept, so that freeing b again needs no allocation
  return b;
}

BlockPool::Block* BlockPool::new_segment(size_t size, void* stream, bool small) {
  const size_t seg = segment_size(size);
  // The bookkeeping first: should it fail, no segment is lost.
  auto b = std::make_unique<Block>(Block{.ptr = nullptr, .size = seg, .stream = stream, .small = small});
  b->node = make_node(b.get());
  void* p = backend_.raw_alloc(seg);
  if (!p) {
    release_cached();
    p = backend_.raw_alloc(seg);
    if (!p) return nullptr;
  }
  b->ptr = static_cast<char*>(p);
  stats_.bytes_reserved += int64_t(seg);
  ++segments_;
  return b.release();
}

void BlockPool::split(Block* b, size_t size) {
  const size_t rest = b->size - size;
  // A small block splits down to the rounding unit; a large one only when the rest is itself
  // a large request, so large segments are not shredded into pieces nobody can use.
  const bool worth = b->small ? rest >= kRound : rest > kSmallRequest;
  if (!worth) return;
  auto r = std::make_unique<Block>(Block{.ptr = b->ptr + size, .size = rest, .stream = b->stream, .small = b->small});
  FreeSet::node_type node = make_node(r.get());
  r->prev = b;
  r->next = b->next;
  if (b->next) b->next->prev = r.get();
  b->next = r.get();
  b->size = size;
  free_set(r->small).insert(std::move(node));
  r.release();
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
  try {
    split(b, size);
    live_.emplace(b->ptr, b);
  } catch (...) {
    --stats_.num_allocations;
    return_block(b);  // out of host memory for the bookkeeping: b goes back unused
    throw;
  }
  b->allocated = true;
  stats_.bytes_in_use += int64_t(b->size);
  stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
  return b->ptr;
}

bool BlockPool::free(void* ptr) noexcept {
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
  try {
    // events has room for one per other stream (record_stream reserved it): no allocation.
    for (void* s : b->other_streams) b->events.push_back(backend_.record_event(s));
  } catch (...) {
    for (void* e : b->events) backend_.destroy_event(e);
    b->events.clear();
    b->other_streams.clear();
    b->next_waiting = lost_;
    lost_ = b;
    return true;
  }
  b->other_streams.clear();
  b->next_waiting = pending_;
  pending_ = b;
  return true;
}

bool BlockPool::record_stream(void* ptr, void* stream) {
  auto it = live_.find(ptr);
  if (it == live_.end()) return false;
  Block* b = it->second;
  if (stream != b->stream && std::find(b->other_streams.begin(), b->other_streams.end(), stream) ==
                                 b->other_streams.end()) {
    b->events.reserve(b->other_streams.size() + 1);  // first: free() relies on the room
    b->other_streams.push_back(stream);
  }
  return true;
}

void BlockPool::return_block(Block* b) noexcept {
  auto& set = free_set(b->small);
  // A neighbour can be merged only when free and not waiting on events: pending blocks are in
  // neither live_ nor the free set, so membership of the free set is the test.
  if (b->prev && !b->prev->allocated && set.count(b->prev)) {
    Block* p = b->prev;
    p->node = set.extract(p);
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
  set.insert(std::move(b->node));
}

void BlockPool::process_pending() {
  Block** link = &pending_;
  while (Block* b = *link) {
    const bool done = std::all_of(b->events.begin(), b->events.end(), [&](void* e) { return backend_.event_done(e); });
    if (!done) {
      link = &b->next_waiting;
      continue;
    }
    *link = b->next_waiting;
    b->next_waiting = nullptr;
    for (void* e : b->events) backend_.destroy_event(e);
    b->events.clear();
    return_block(b);
  }
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
