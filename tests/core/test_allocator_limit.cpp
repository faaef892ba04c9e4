// The CPU allocator's memory limit (PyTorch's per-process memory fraction) and its unrounded
// peak: a request past the limit raises a clear out-of-memory error after the cache has been
// returned, changes nothing, and the allocator goes on serving; the peak of requested bytes
// counts what tensors asked for, not their size classes.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/factory.h"
#include "nn/models/bert.h"
#include "process_test_util.h"
#include "test_util.h"

using namespace ember;

namespace {

// Restores the limit a test changed, also when an assertion fails.
struct LimitGuard {
  LimitGuard() : saved(cpu_allocator().memory_limit()) {}
  ~LimitGuard() { cpu_allocator().set_memory_limit(saved); }
  int64_t saved;
};

constexpr int64_t kMiB = int64_t(1) << 20;

}  // namespace

TEST(AllocatorLimit, RequestedBytesCountWhatTensorsAskedFor) {
  CpuCachingAllocator& a = cpu_allocator();
  const AllocatorStats before = a.stats();
  {
    Tensor t = empty({1000}, {DType::f32});  // 4000 bytes, in the 4096-byte class
    const AllocatorStats during = a.stats();
    EXPECT_EQ(during.requested_bytes_in_use - before.requested_bytes_in_use, 4000);
    EXPECT_EQ(during.bytes_in_use - before.bytes_in_use, 4096);
    a.reset_peak();
    EXPECT_EQ(a.stats().peak_requested_bytes, during.requested_bytes_in_use);
    Tensor u = empty({3000}, {DType::f32});
    EXPECT_EQ(a.stats().peak_requested_bytes, during.requested_bytes_in_use + 12000);
  }
  EXPECT_EQ(a.stats().requested_bytes_in_use, before.requested_bytes_in_use);
  EXPECT_GE(a.stats().peak_requested_bytes, before.requested_bytes_in_use + 16000);
}

TEST(AllocatorLimit, ARequestPastTheLimitRaisesAndChangesNothing) {
  LimitGuard guard;
  CpuCachingAllocator& a = cpu_allocator();
  a.empty_cache();
  const int64_t base = a.stats().bytes_reserved;
  a.set_memory_limit(base + 4 * kMiB);
  Tensor fits = empty({kMiB / 4}, {DType::f32});  // 1 MiB
  const AllocatorStats before = a.stats();
  EXPECT_EMBER_ERROR(empty({2 * kMiB}, {DType::f32}), "out of memory", "8388608 bytes", "memory limit",
                     "EMBER_CPU_MEMORY_LIMIT");
  const AllocatorStats after = a.stats();
  EXPECT_EQ(after.bytes_reserved, before.bytes_reserved);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(after.requested_bytes_in_use, before.requested_bytes_in_use);
  // Still serving, up to the limit.
  Tensor more = empty({kMiB / 2}, {DType::f32});  // 2 MiB: 3 of 4 in use
  more.fill_(1.0);
  EXPECT_EQ(more.sum().item<double>(), double(kMiB / 2));
  a.set_memory_limit(0);  // no limit
  Tensor big = empty({2 * kMiB}, {DType::f32});
  EXPECT_EQ(big.numel(), 2 * kMiB);
}

TEST(AllocatorLimit, CachedBlocksAreReturnedBeforeALimitRefuses) {
  LimitGuard guard;
  CpuCachingAllocator& a = cpu_allocator();
  a.empty_cache();
  const int64_t base = a.stats().bytes_reserved;
  { Tensor cached = empty({kMiB / 2}, {DType::f32}); }  // 2 MiB, now cached
  EXPECT_EQ(a.stats().bytes_reserved, base + 2 * kMiB);
  a.set_memory_limit(base + 3 * kMiB);
  // Another class: only fits once the cached 2 MiB go back to the system.
  Tensor t = empty({kMiB * 3 / 4 - 16}, {DType::f32});
  EXPECT_LE(a.stats().bytes_reserved, base + 3 * kMiB);
}

TEST(AllocatorLimit, AModelThatDoesNotFitRaisesAndTheProcessGoesOn) {
  LimitGuard guard;
  CpuCachingAllocator& a = cpu_allocator();
  a.empty_cache();
  a.set_memory_limit(a.stats().bytes_reserved + 2 * kMiB);
  const int64_t in_use = a.stats().bytes_in_use;
  // BERT-mini's embeddings alone are about 4 MiB in f32.
  EXPECT_EMBER_ERROR(std::make_shared<nn::BertForMaskedLM>(nn::BertConfig::tiny(8192)), "out of memory",
                     "memory limit");
  EXPECT_EQ(a.stats().bytes_in_use, in_use);  // the half-built model was freed
}

TEST(AllocatorLimit, TheVariableIsParsedOrNamed) {
  EXPECT_EQ(CpuCachingAllocator::parse_memory_limit("4096"), 4096);
  EXPECT_EQ(CpuCachingAllocator::parse_memory_limit("512K"), 512 << 10);
  EXPECT_EQ(CpuCachingAllocator::parse_memory_limit("3M"), 3 * kMiB);
  EXPECT_EQ(CpuCachingAllocator::parse_memory_limit("2G"), int64_t(2) << 30);
  for (const char* bad : {"", "G", "1.5G", "-4", "10T", "12 M", "9999999999999999"})
    EXPECT_EMBER_ERROR(CpuCachingAllocator::parse_memory_limit(bad), "EMBER_CPU_MEMORY_LIMIT", bad);
  EXPECT_EMBER_ERROR(cpu_allocator().set_memory_limit(-1), "memory limit", ">= 0");
}

// The limit this process started with: EMBER_CPU_MEMORY_LIMIT's, or none. The next test runs
// this one in a new process with the variable set.
TEST(AllocatorLimit, TheProcessStartsWithTheVariablesLimit) {
  const char* value = std::getenv("EMBER_CPU_MEMORY_LIMIT");
  const int64_t want = value && *value ? CpuCachingAllocator::parse_memory_limit(value) : 0;
  EXPECT_EQ(cpu_allocator().memory_limit(), want);
}

TEST(AllocatorLimit, TheVariableSetsTheLimitOfANewProcess) {
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(n, 0);
  ember::testing::TempDir dir("allocator_limit");
  const std::string run = std::string(self) + " --gtest_filter=AllocatorLimit.TheProcessStartsWithTheVariablesLimit";
  EXPECT_EQ(std::system(("EMBER_CPU_MEMORY_LIMIT=64M " + run + " > " + dir.file("ok.log") + " 2>&1").c_str()), 0);
  EXPECT_NE(ember::testing::read_text_file(dir.file("ok.log")).find("[  PASSED  ] 1 test"), std::string::npos);
  // A bad value is an error naming the variable, not a silent default.
  EXPECT_NE(std::system(("EMBER_CPU_MEMORY_LIMIT=lots " + run + " > " + dir.file("bad.log") + " 2>&1").c_str()), 0);
  EXPECT_NE(ember::testing::read_text_file(dir.file("bad.log")).find("EMBER_CPU_MEMORY_LIMIT"), std::string::npos);
}
