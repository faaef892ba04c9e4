// The bookkeeping of a caching allocator, apart from the memory it manages: segments obtained
// from a backend (cudaMalloc for device memory, cudaHostAlloc for pinned host memory) are cut
// into blocks, handed out best-fit, split when much larger than asked, merged with free
// neighbours when freed, and returned to the backend only by release_cached().
//
// Reuse is stream-ordered: a free block goes back only to requests on the stream it was
// allocated on, where queued work runs in order, so no synchronisation is needed. A block that
// was also used on other streams (record_stream) waits, after it is freed, for an event on each
// of them before it can be handed out again.
//
// Freeing never allocates and never throws: every block owns, from the time it is made, the
// free-set node it will be filed under, and the room for the events its recorded streams need,
// so free() runs safely in a destructor while an out-of-memory error unwinds.
//
// Nothing here includes CUDA: streams and events are opaque pointers and the backend does the
// driver calls, so the same logic is tested on the host with a fake backend.
#pragma once
#include <cstddef>
#include <set>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"

namespace ember::cuda {

class PoolBackend {
 public:
  virtual ~PoolBackend() = default;
  // A fresh segment of `nbytes`, or nullptr when the memory is exhausted.
  virtual void* raw_alloc(size_t nbytes) = 0;
  virtual void raw_free(void* ptr) = 0;
  // An event recorded on `stream` now; event_done says whether the work before it finished.
  virtual void* record_event(void* stream) = 0;
  virtual bool event_done(void* event) = 0;
  virtual void destroy_event(void* event) = 0;
};

class BlockPool {
 public:
  static constexpr size_t kRound = 512;                      // every block a multiple of this
  static constexpr size_t kSmallRequest = size_t(1) << 20;   // up to here: small pool
  static constexpr size_t kSmallSegment = size_t(2) << 20;   // small requests share 2 MiB segments
  static constexpr size_t kMediumRequest = size_t(10) << 20;
  static constexpr size_t kMediumSegment = size_t(20) << 20;  // 1-10 MiB requests share 20 MiB
  static constexpr size_t kSegmentRound = size_t(2) << 20;    // larger ones get their own

  explicit BlockPool(PoolBackend& backend) : backend_(backend) {}
  ~BlockPool();  // frees nothing: the driver may be gone at exit (see cuda_allocator())
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block of at least nbytes for use on `stream`, or nullptr when the backend is out of
  // memory even after every cached segment was returned to it.
  void* allocate(size_t nbytes, void* stream);
  // Gives back a block from allocate(); false when `ptr` is not a live block of this pool.
  // When the backend cannot record an event for a stream the block was used on, the block is
  // never handed out again (that stream may still use it).
  bool free(void* ptr) noexcept;
  // The block holding `ptr` is used on `stream` as well; false when ptr is not live here.
  bool record_stream(void* ptr, void* stream);
  // Returns every wholly free segment to the backend.
  void release_cached();

  AllocatorStats stats() const { return stats_; }
  void reset_peak() { stats_.peak_bytes_in_use = stats_.bytes_in_use; }
  int64_t segment_count() const { return int64_t(segments_); }
  // Bytes a request of nbytes occupies, and the segment a fresh one of that size comes from.
  static size_t round_size(size_t nbytes);
  static size_t segment_size(size_t rounded);

 private:
  struct Block;
  struct Order {  // stream, then size, then address: best fit on one stream
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeSet = std::set<Block*, Order>;
  struct Block {
    char* ptr;
    size_t size;
    void* stream;
    bool small;           // belongs to the small pool (segments of kSmallSegment)
    bool allocated = false;
    Block* prev = nullptr;  // neighbours inside the segment
    Block* next = nullptr;
    std::vector<void*> other_streams{};  // record_stream
    std::vector<void*> events{};         // one per other stream once freed; capacity reserved
    Block* next_waiting = nullptr;       // in the pending or the lost list
    FreeSet::node_type node{};           // its free-set node while it is not in a free set
  };

  // A node of a FreeSet holding `b`, to be inserted later without allocating.
  static FreeSet::node_type make_node(Block* b);
  FreeSet& free_set(bool small) { return small ? small_free_ : large_free_; }
  Block* take_free_block(size_t size, void* stream, bool small);
  Block* new_segment(size_t size, void* stream, bool small);
  void split(Block* b, size_t size);
  void return_block(Block* b) noexcept;  // merge with free neighbours, then into the free set
  void process_pending();

  PoolBackend& backend_;
  FreeSet small_free_, large_free_;
  std::unordered_map<void*, Block*> live_;
  Block* pending_ = nullptr;  // freed, waiting for the events of their other streams
  Block* lost_ = nullptr;     // freed, but an event could not be recorded: never reused
  AllocatorStats stats_;
  size_t segments_ = 0;
};

}  // namespace ember::cuda
