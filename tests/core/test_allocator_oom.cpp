// Running out of memory is an error the program can catch, also in the middle of building a
// model: freeing the tensors of the half-built model, during unwinding, must neither allocate
// nor throw (a throw from a destructor there aborts the process). The out-of-memory cases run
// in a forked child under an address-space limit (RLIMIT_AS), and the parent checks that the
// child exited normally.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/parallel.h"
#include "nn/models/bert.h"
#include "test_util.h"

using namespace ember;

namespace {

// gcc says so with __SANITIZE_*__, clang with __has_feature.
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define EMBER_TEST_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || defined(EMBER_TEST_SANITIZED)
constexpr bool kSanitized = true;  // the sanitizers' own allocators die under RLIMIT_AS
#else
constexpr bool kSanitized = false;
#endif

// The process's address space now, from /proc/self/statm (in pages).
size_t address_space_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long pages = 0;
  const int got = std::fscanf(f, "%lu", &pages);
  std::fclose(f);
  return got == 1 ? size_t(pages) * size_t(::sysconf(_SC_PAGESIZE)) : 0;
}

// Runs `body` in a child whose address space may grow by `headroom` bytes at most, and
// returns its wait status. The child's exit code is body's result; 90 when body threw.
int run_with_memory_limit(size_t headroom, const std::function<int()>& body) {
  const int threads = get_num_threads();
  set_num_threads(1);  // a forked child has no pool threads: run every op inline
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const size_t now = address_space_bytes();
    const rlimit rl{rlim_t(now + headroom), rlim_t(now + headroom)};
    if (now == 0 || ::setrlimit(RLIMIT_AS, &rl) != 0) ::_exit(91);
    int rc = 90;
    try {
      rc = body();
    } catch (...) {
    }
    ::_exit(rc);
  }
  int status = -1;
  if (pid > 0) ::waitpid(pid, &status, 0);
  set_num_threads(threads);
  return status;
}

::testing::AssertionResult exited_zero(int status) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return ::testing::AssertionSuccess();
  if (WIFSIGNALED(status))
    return ::testing::AssertionFailure() << "the child died of signal " << WTERMSIG(status)
                                         << " (a throw from a destructor aborts)";
  return ::testing::AssertionFailure() << "the child exited with " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

constexpr size_t kMiB = size_t(1) << 20;

}  // namespace

TEST(AllocatorOom, DeallocateIsNoexcept) {
  static_assert(noexcept(std::declval<Allocator&>().deallocate(nullptr, 0)));
  static_assert(noexcept(std::declval<CpuCachingAllocator&>().deallocate(nullptr, 0)));
  SUCCEED();
}

TEST(AllocatorOom, FreedBlocksAreReusedByClassWithoutGrowingTheReserve) {
  CpuCachingAllocator alloc;  // a private instance: the counts are this test's alone
  // One block of each of many classes, freed, then asked for again: all from the cache.
  std::vector<std::pair<void*, size_t>> blocks;
  for (size_t n : {size_t(1), size_t(100), size_t(3000), size_t(70000), kMiB, kMiB + 1, 5 * kMiB + 3, 64 * kMiB})
    blocks.push_back({alloc.allocate(n), n});
  const AllocatorStats full = alloc.stats();
  for (auto [p, n] : blocks) alloc.deallocate(p, n);
  EXPECT_EQ(alloc.stats().bytes_in_use, 0);
  EXPECT_EQ(alloc.stats().bytes_reserved, full.bytes_reserved);
  for (auto [p, n] : blocks) {
    void* q = alloc.allocate(n);
    EXPECT_EQ(q, p) << n << " bytes: the cached block of its class comes back";
  }
  const AllocatorStats again = alloc.stats();
  EXPECT_EQ(again.num_cache_hits, int64_t(blocks.size()));
  EXPECT_EQ(again.bytes_reserved, full.bytes_reserved);
  // Same class, other request: 2500 and 3000 bytes both take a 4 KiB block.
  alloc.deallocate(blocks[2].first, 3000);
  EXPECT_EQ(alloc.allocate(2500), blocks[2].first);
  for (auto [p, n] : blocks) alloc.deallocate(p, n);
  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().bytes_reserved, 0);
}

TEST(AllocatorOom, ImpossibleRequestsAreErrors) {
  CpuCachingAllocator alloc;
  EXPECT_EMBER_ERROR(alloc.allocate(CpuCachingAllocator::kMaxRequest + 1), "CPU allocator: out of memory allocating");
  EXPECT_EMBER_ERROR(alloc.allocate(SIZE_MAX), "CPU allocator: out of memory allocating");
  EXPECT_EQ(CpuCachingAllocator::round_size(CpuCachingAllocator::kMaxRequest), CpuCachingAllocator::kMaxRequest);
  EXPECT_EQ(CpuCachingAllocator::round_size(CpuCachingAllocator::kMaxRequest - 1), CpuCachingAllocator::kMaxRequest);
}

TEST(AllocatorOom, ModelConstructionOutOfMemoryRaisesInsteadOfAborting) {
  if (kSanitized) GTEST_SKIP() << "RLIMIT_AS does not apply under a sanitizer's allocator";
  const int status = run_with_memory_limit(384 * kMiB, [] {
    nn::BertConfig cfg = nn::BertConfig::mini();  // about 11 M parameters, 44 MB in f32
    std::vector<std::shared_ptr<nn::BertForMaskedLM>> models;
    models.reserve(64);
    bool raised = false;
    try {
      for (int i = 0; i < 64; ++i) models.push_back(std::make_shared<nn::BertForMaskedLM>(cfg));
    } catch (const Error& e) {
      raised = std::string(e.what()).find("out of memory") != std::string::npos;
    } catch (const std::bad_alloc&) {
      raised = true;
    }
    if (!raised) return 2;
    // Freeing the models under the same pressure, then building one again from what was freed.
    models.clear();
    auto again = std::make_shared<nn::BertForMaskedLM>(cfg);
    return again->parameters().empty() ? 3 : 0;
  });
  EXPECT_TRUE(exited_zero(status));
}

TEST(AllocatorOom, FreeingWithNoMemoryLeftDoesNotThrow) {
  if (kSanitized) GTEST_SKIP() << "RLIMIT_AS does not apply under a sanitizer's allocator";
  const int status = run_with_memory_limit(128 * kMiB, [] {
    std::vector<Tensor> held;
    held.reserve(size_t(1) << 20);  // before memory runs out: holding a tensor needs no growth
    // Fill the address space with ever smaller tensors, of many size classes, until even a
    // 64-byte one fails: nothing is left for the free path to allocate from.
    int64_t failures = 0;
    for (int64_t n = int64_t(4) << 20; n >= 16 && held.size() < held.capacity(); ) {
      try {
        held.push_back(empty({n + 3}));  // +3: not a power of two, another class above 1 MiB
      } catch (const Error&) {
        ++failures;
        n /= 2;
      } catch (const std::bad_alloc&) {
        ++failures;
        n /= 2;
      }
    }
    if (failures == 0) return 2;
    const int64_t cached_before = cpu_allocator().stats().bytes_reserved;
    held.clear();  // every block goes back to the cache, with no memory to spare
    held.shrink_to_fit();
    // The freed blocks are reused: a tensor of a class that was freed is a cache hit.
    const int64_t hits = cpu_allocator().stats().num_cache_hits;
    Tensor t = empty({(int64_t(4) << 20) + 3});
    if (cpu_allocator().stats().num_cache_hits != hits + 1) return 3;
    return cpu_allocator().stats().bytes_reserved == cached_before ? 0 : 4;
  });
  EXPECT_TRUE(exited_zero(status));
}
