// The caching allocator's bookkeeping (kernels/cuda/block_pool.h) on the host, with a backend
// that hands out malloc'd segments and events the test completes by hand: best fit, splitting,
// merging, stream-ordered reuse, record_stream delays, release of whole segments, statistics,
// and out-of-memory. Runs without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <set>
#include <vector>

#include "kernels/cuda/block_pool.h"

using ember::cuda::BlockPool;
using ember::cuda::PoolBackend;

namespace {

class FakeBackend final : public PoolBackend {
 public:
  size_t limit = SIZE_MAX;  // bytes the "device" holds
  size_t held = 0;
  std::vector<std::pair<void*, size_t>> segments;
  std::set<void*> live_events, done_events;
  int next_event = 1;

  void* raw_alloc(size_t n) override {
    if (held + n > limit) return nullptr;
    void* p = std::aligned_alloc(256, n);
    held += n;
    segments.push_back({p, n});
    return p;
  }
  void raw_free(void* p) override {
    for (auto it = segments.begin(); it != segments.end(); ++it)
      if (it->first == p) {
        held -= it->second;
        segments.erase(it);
        std::free(p);
        return;
      }
    ADD_FAILURE() << "raw_free of a pointer that is no segment";
  }
  void* record_event(void*) override {
    void* e = reinterpret_cast<void*>(uintptr_t(next_event++) << 4);
    live_events.insert(e);
    return e;
  }
  bool event_done(void* e) override { return done_events.count(e) != 0; }
  void destroy_event(void* e) override { live_events.erase(e); }
  void finish_all() { done_events.insert(live_events.begin(), live_events.end()); }
  ~FakeBackend() override {
    for (auto& [p, n] : segments) std::free(p);
  }
};

void* const kStreamA = reinterpret_cast<void*>(0x1000);
void* const kStreamB = reinterpret_cast<void*>(0x2000);
constexpr size_t MiB = size_t(1) << 20;

TEST(BlockPool, RoundsToTheUnitAndPicksSegmentSizes) {
  EXPECT_EQ(BlockPool::round_size(0), 512u);
  EXPECT_EQ(BlockPool::round_size(1), 512u);
  EXPECT_EQ(BlockPool::round_size(513), 1024u);
  EXPECT_EQ(BlockPool::segment_size(512), 2 * MiB);
  EXPECT_EQ(BlockPool::segment_size(MiB), 2 * MiB);
  EXPECT_EQ(BlockPool::segment_size(MiB + 512), 20 * MiB);
  EXPECT_EQ(BlockPool::segment_size(10 * MiB), 20 * MiB);
  EXPECT_EQ(BlockPool::segment_size(10 * MiB + 512), 12 * MiB);
  EXPECT_EQ(BlockPool::segment_size(33 * MiB), 34 * MiB);
}

TEST(BlockPool, SmallRequestsShareOneSegmentAndDoNotOverlap) {
  FakeBackend be;
  BlockPool pool(be);
  std::vector<std::pair<char*, size_t>> blocks;
  for (size_t n : {100, 512, 700, 4096, 5000, 65536}) {
    char* p = static_cast<char*>(pool.allocate(n, kStreamA));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
    blocks.push_back({p, BlockPool::round_size(n)});
  }
  EXPECT_EQ(be.segments.size(), 1u);
  EXPECT_EQ(pool.stats().bytes_reserved, int64_t(2 * MiB));
  for (size_t i = 0; i < blocks.size(); ++i)
    for (size_t j = i + 1; j < blocks.size(); ++j) {
      const bool disjoint = blocks[i].first + blocks[i].second <= blocks[j].first ||
                            blocks[j].first + blocks[j].second <= blocks[i].first;
      EXPECT_TRUE(disjoint) << i << " and " << j << " overlap";
    }
  int64_t in_use = 0;
  for (auto& b : blocks) in_use += int64_t(b.second);
  EXPECT_EQ(pool.stats().bytes_in_use, in_use);
}

TEST(BlockPool, FreedBlocksMergeBackIntoTheWholeSegment) {
  FakeBackend be;
  BlockPool pool(be);
  void* a = pool.allocate(1000, kStreamA);
  void* b = pool.allocate(3000, kStreamA);
  void* c = pool.allocate(5000, kStreamA);
  // Free the middle first, then the ends: all three merge with the tail into one block.
  EXPECT_TRUE(pool.free(b));
  EXPECT_TRUE(pool.free(a));
  EXPECT_TRUE(pool.free(c));
  EXPECT_EQ(pool.stats().bytes_in_use, 0);
  // The whole 2 MiB segment is one free block again: a 1 MiB request fits without a new segment.
  void* big = pool.allocate(MiB, kStreamA);
  EXPECT_EQ(big, a);
  EXPECT_EQ(be.segments.size(), 1u);
  pool.free(big);
  pool.release_cached();
  EXPECT_EQ(be.segments.size(), 0u);
  EXPECT_EQ(pool.stats().bytes_reserved, 0);
}

TEST(BlockPool, BestFitReusesTheSmallestFreeBlock) {
  FakeBackend be;
  BlockPool pool(be);
  void* a = pool.allocate(4096, kStreamA);
  void* sep1 = pool.allocate(512, kStreamA);
  void* b = pool.allocate(1024, kStreamA);
  void* sep2 = pool.allocate(512, kStreamA);
  pool.free(a);
  pool.free(b);
  const int64_t hits = pool.stats().num_cache_hits;
  EXPECT_EQ(pool.allocate(1000, kStreamA), b);  // the 1 KiB hole, not the 4 KiB one
  EXPECT_EQ(pool.allocate(2048, kStreamA), a);  // split off the front of the 4 KiB hole
  EXPECT_EQ(pool.stats().num_cache_hits, hits + 2);
  EXPECT_EQ(be.segments.size(), 1u);
  (void)sep1;
  (void)sep2;
}

TEST(BlockPool, ReuseStaysOnTheStreamOfTheBlock) {
  FakeBackend be;
  BlockPool pool(be);
  void* a = pool.allocate(MiB * 4, kStreamA);
  pool.free(a);
  void* b = pool.allocate(MiB * 4, kStreamB);
  EXPECT_NE(a, b);  // stream B gets its own segment
  EXPECT_EQ(be.segments.size(), 2u);
  EXPECT_EQ(pool.allocate(MiB * 4, kStreamA), a);
}

TEST(BlockPool, LargeBlocksSplitOnlyWhenTheRestIsALargeRequest) {
  FakeBackend be;
  BlockPool pool(be);
  char* a = static_cast<char*>(pool.allocate(3 * MiB, kStreamA));  // from a 20 MiB segment
  char* b = static_cast<char*>(pool.allocate(3 * MiB, kStreamA));
  EXPECT_EQ(b, a + 3 * MiB);
  EXPECT_EQ(be.segments.size(), 1u);
  pool.free(a);
  pool.free(b);
  // 19.5 MiB asked of the merged 20 MiB block: the 0.5 MiB rest is not split off.
  void* c = pool.allocate(20 * MiB - MiB / 2, kStreamA);
  EXPECT_EQ(c, a);
  EXPECT_EQ(pool.stats().bytes_in_use, int64_t(20 * MiB));
}

TEST(BlockPool, RecordedStreamDelaysReuseUntilItsEventCompletes) {
  FakeBackend be;
  BlockPool pool(be);
  void* a = pool.allocate(8192, kStreamA);
  void* keep = pool.allocate(512, kStreamA);  // keeps the segment from being one free block
  ASSERT_TRUE(pool.record_stream(a, kStreamB));
  pool.free(a);
  EXPECT_EQ(be.live_events.size(), 1u);
  void* b = pool.allocate(8192, kStreamA);
  EXPECT_NE(b, a);  // the event is pending: a is not handed out
  pool.free(b);
  be.finish_all();
  // b merged back into the free tail; a returns on the next allocation's pending sweep and
  // merges with its free neighbours, so the lowest address is served again.
  EXPECT_EQ(pool.allocate(8192, kStreamA), a);
  EXPECT_TRUE(be.live_events.empty());
  (void)keep;
}

TEST(BlockPool, OutOfMemoryReleasesCachedSegmentsThenReportsNull) {
  FakeBackend be;
  be.limit = 40 * MiB;
  BlockPool pool(be);
  void* a = pool.allocate(30 * MiB, kStreamA);
  ASSERT_NE(a, nullptr);
  pool.free(a);  // cached, 30 MiB reserved
  void* b = pool.allocate(36 * MiB, kStreamA);  // needs the cache returned first
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(be.segments.size(), 1u);
  EXPECT_EQ(pool.allocate(20 * MiB, kStreamA), nullptr);
  EXPECT_EQ(pool.stats().num_allocations, 2);
  EXPECT_FALSE(pool.free(reinterpret_cast<void*>(0x1234)));
}

TEST(BlockPool, StatisticsTrackUseReservedAndPeak) {
  FakeBackend be;
  BlockPool pool(be);
  void* a = pool.allocate(1000, kStreamA);
  void* b = pool.allocate(5 * MiB, kStreamA);
  EXPECT_EQ(pool.stats().bytes_in_use, int64_t(1024 + 5 * MiB));
  EXPECT_EQ(pool.stats().bytes_reserved, int64_t(2 * MiB + 20 * MiB));
  pool.free(b);
  EXPECT_EQ(pool.stats().peak_bytes_in_use, int64_t(1024 + 5 * MiB));
  pool.reset_peak();
  EXPECT_EQ(pool.stats().peak_bytes_in_use, 1024);
  EXPECT_EQ(pool.segment_count(), 2);
  pool.release_cached();  // the 20 MiB segment is wholly free; the small one is not
  EXPECT_EQ(pool.segment_count(), 1);
  EXPECT_EQ(pool.stats().bytes_reserved, int64_t(2 * MiB));
  pool.free(a);
}

// Random allocations and frees on two streams: live blocks never overlap, and once all are
// freed every segment merges back whole and is released.
TEST(BlockPool, RandomWorkloadKeepsBlocksDisjointAndMergesCompletely) {
  FakeBackend be;
  BlockPool pool(be);
  std::mt19937 rng(std::random_device{}());
  std::vector<std::pair<char*, size_t>> live;
  for (int step = 0; step < 4000; ++step) {
    if (!live.empty() && (rng() % 2 == 0)) {
      const size_t k = rng() % live.size();
      ASSERT_TRUE(pool.free(live[k].first));
      live.erase(live.begin() + long(k));
      continue;
    }
    const size_t n = rng() % 4 == 0 ? 1 + rng() % (12 * MiB) : 1 + rng() % 70000;
    void* stream = rng() % 2 ? kStreamA : kStreamB;
    char* p = static_cast<char*>(pool.allocate(n, stream));
    ASSERT_NE(p, nullptr);
    for (auto& [q, m] : live) ASSERT_TRUE(p + BlockPool::round_size(n) <= q || q + m <= p);
    live.push_back({p, BlockPool::round_size(n)});
  }
  for (auto& [p, n] : live) ASSERT_TRUE(pool.free(p));
  EXPECT_EQ(pool.stats().bytes_in_use, 0);
  pool.release_cached();
  EXPECT_EQ(pool.segment_count(), 0);
  EXPECT_TRUE(be.segments.empty());
}

}  // namespace
