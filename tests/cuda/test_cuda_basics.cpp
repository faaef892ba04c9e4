// The first CUDA pieces: device tensors and the trip to and from the host, fill, strided and
// converting copies, the binary arithmetic kernels against the CPU and the double reference,
// random draws equal to the CPU's, the caching allocator's segment rules and the device it
// allocates on. Tests that need a GPU skip without one; the last test checks the error a user
// gets on a machine without one.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/device_api.h"
#include "core/native/random.h"
#include "kernels/cuda/block_pool.h"
#include "kernels/cuda/cuda_allocator.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_tensor;
using ember::testing::tolerance;

namespace {

const std::vector<DType> kAllDTypes = {DType::f32, DType::f64,  DType::f16,    DType::bf16,
                                       DType::i32, DType::i64, DType::boolean};

// The elements' bytes in logical order, for exact comparisons.
std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.to(Device::cpu()).contiguous();
  const auto* p = static_cast<const uint8_t*>(c.raw_data());
  return std::vector<uint8_t>(p, p + size_t(c.numel()) * c.element_size());
}

::testing::AssertionResult same_bytes(const Tensor& actual, const Tensor& expected) {
  if (actual.shape() != expected.shape() || actual.dtype() != expected.dtype())
    return ::testing::AssertionFailure() << "got " << shape_str(actual.shape()) << " " << dtype_name(actual.dtype())
                                         << ", expected " << shape_str(expected.shape()) << " "
                                         << dtype_name(expected.dtype());
  const auto a = bytes_of(actual), e = bytes_of(expected);
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != e[i]) {
      const size_t el = i / actual.element_size();
      return ::testing::AssertionFailure() << "element " << el << " differs: got "
                                           << actual.to(Device::cpu()).contiguous().flatten().select(0, int64_t(el)).item_double()
                                           << ", expected "
                                           << expected.to(Device::cpu()).contiguous().flatten().select(0, int64_t(el)).item_double();
    }
  }
  return ::testing::AssertionSuccess();
}

const Device kGpu = Device::cuda(0);

// a + alpha * b in double, broadcast.
reference::RefTensor ref_add(const Tensor& a, const Tensor& b, double alpha) {
  const reference::RefTensor ra = reference::from_tensor(a), rb = reference::from_tensor(b);
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), "ref_add");
  reference::RefTensor out(shape);
  for (int64_t i = 0; i < out.numel(); ++i) {
    const Shape idx = reference::unravel(i, shape);
    out.data[size_t(i)] = ra.broadcast_at(idx, shape) + alpha * rb.broadcast_at(idx, shape);
  }
  return out;
}

}  // namespace

TEST(CudaBasics, TensorsGoToTheDeviceAndBackUnchanged) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = random_tensor({3, 5, 7}, dt);
    const Tensor d = x.to(kGpu);
    EXPECT_TRUE(d.is_cuda());
    EXPECT_EQ(d.device(), kGpu);
    EXPECT_EQ(d.shape(), x.shape());
    EXPECT_EQ(d.dtype(), dt);
    EXPECT_TRUE(same_bytes(d.to(Device::cpu()), x));
    // a strided host tensor is made contiguous on the way
    const Tensor xs = random_tensor({4, 6}, dt, /*non_contiguous=*/true);
    EXPECT_TRUE(same_bytes(xs.to(kGpu), xs.contiguous()));
    // a one-element tensor reads back through item()
    const Tensor one = full({1}, 3.0, {dt, kGpu});
    EXPECT_EQ(one.item<double>(), dt == DType::boolean ? 1.0 : 3.0);
  }
}

TEST(CudaBasics, FillMatchesCpuInEveryDtype) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kAllDTypes) {
    for (double v : {0.0, 1.5, -2.75, 3.0, 1e-3}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " value " + std::to_string(v));
      EXPECT_TRUE(same_bytes(full({5, 33}, v, {dt, kGpu}), full({5, 33}, v, {dt})));
    }
    // fill through a strided view touches exactly the viewed elements
    Tensor g = zeros({6, 8}, {dt, kGpu});
    Tensor c = zeros({6, 8}, {dt});
    g.slice(1, 1, 8, 2).transpose(0, 1).fill_(7.0);
    c.slice(1, 1, 8, 2).transpose(0, 1).fill_(7.0);
    EXPECT_TRUE(same_bytes(g, c)) << dtype_name(dt);
  }
}

TEST(CudaBasics, CopyConvertsBetweenEveryPairOfDtypes) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType from : kAllDTypes) {
    const Tensor x = random_tensor({9, 11}, from, false, -300.0, 300.0);
    const Tensor xg = x.to(kGpu);
    for (DType to : kAllDTypes) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + dtype_name(to));
      EXPECT_TRUE(same_bytes(xg.to(to), x.to(to)));
      // converting and strided at once
      EXPECT_TRUE(same_bytes(xg.t().to(to), x.t().to(to)));
    }
  }
}

TEST(CudaBasics, CopyBroadcastsAndWalksStridedViews) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  // broadcast copy_ on the device
  const Tensor src = random_tensor({5, 1});
  Tensor dg = zeros({4, 5, 6}, {DType::f32, kGpu});
  Tensor dc = zeros({4, 5, 6});
  dg.copy_(src.to(kGpu));
  dc.copy_(src);
  EXPECT_TRUE(same_bytes(dg, dc));
  // permuted and stepped views made contiguous
  const Tensor x = random_tensor({3, 4, 5, 6}, DType::bf16);
  const Tensor xg = x.to(kGpu);
  EXPECT_TRUE(same_bytes(xg.permute({2, 0, 3, 1}).contiguous(), x.permute({2, 0, 3, 1}).contiguous()));
  EXPECT_TRUE(same_bytes(xg.slice(3, 1, 6, 2).slice(0, 2, 3).contiguous(), x.slice(3, 1, 6, 2).slice(0, 2, 3).contiguous()));
  // more dims than one kernel indexes at once (reversed dims never merge)
  Shape twelve(12, 2), rev(12);
  for (int64_t d = 0; d < 12; ++d) rev[size_t(d)] = 11 - d;
  const Tensor big = random_tensor(twelve, DType::f64);
  EXPECT_TRUE(same_bytes(big.to(kGpu).permute(rev).contiguous(), big.permute(rev).contiguous()));
  EXPECT_TRUE(same_bytes(big.to(kGpu).permute(rev).to(DType::f16), big.permute(rev).to(DType::f16)));
  // host -> strided device view, and device -> strided host view
  Tensor yg = zeros({6, 4}, {DType::f32, kGpu});
  Tensor yc = zeros({6, 4});
  const Tensor patch = random_tensor({4, 3}, DType::f64);
  yg.slice(0, 0, 6, 2).t().copy_(patch);
  yc.slice(0, 0, 6, 2).t().copy_(patch);
  EXPECT_TRUE(same_bytes(yg, yc));
  Tensor back = zeros({3, 8}, {DType::f64});
  back.slice(1, 0, 8, 2).copy_(yg.slice(0, 0, 3));
  Tensor back_ref = zeros({3, 8}, {DType::f64});
  back_ref.slice(1, 0, 8, 2).copy_(yc.slice(0, 0, 3));
  EXPECT_TRUE(same_bytes(back, back_ref));
}

TEST(CudaBasics, AddMatchesReferenceAndCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{1000003}, {1000003}},  // vector body plus a tail
      {{37, 129}, {37, 129}},
      {{4, 1, 5}, {3, 1}},     // broadcast both ways
      {{2, 3, 8}, {8}},        // bias-style broadcast
      {{}, {7}},
      {{0, 3}, {3}}};
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i32, DType::i64}) {
    const double tol = tolerance(dt);
    for (const auto& [sa, sb] : shapes) {
      for (double alpha : {1.0, -2.0}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + shape_str(sa) + " + " + shape_str(sb) +
                     " alpha " + std::to_string(alpha));
        const Tensor a = random_tensor(sa, dt, false, -50, 50), b = random_tensor(sb, dt, false, -50, 50);
        const Tensor got = add(a.to(kGpu), b.to(kGpu), alpha);
        EXPECT_TRUE(got.is_cuda());
        EXPECT_TRUE(all_close(got, ref_add(a, b, alpha), tol, tol));
        if (alpha == 1.0) {
          EXPECT_TRUE(same_bytes(got, add(a, b)));
        }
      }
    }
    // misaligned starts (views at an element offset) and strided operands
    const Tensor a = random_tensor({1001}, dt).to(kGpu), b = random_tensor({1001}, dt).to(kGpu);
    EXPECT_TRUE(same_bytes(add(a.narrow(0, 1, 1000), b.narrow(0, 0, 1000)),
                           add(a.narrow(0, 1, 1000).to(Device::cpu()), b.narrow(0, 0, 1000).to(Device::cpu()))));
    const Tensor m = random_tensor({33, 17}, dt, true), n = random_tensor({17, 33}, dt);
    EXPECT_TRUE(all_close(add(m.to(kGpu), n.to(kGpu).t()), ref_add(m, n.t(), 1.0), tol, tol));
    // in place, through the same kernel
    Tensor acc = a.clone();
    acc.add_(b);
    EXPECT_TRUE(same_bytes(acc, add(a, b)));
  }
}

TEST(CudaBasics, OtherBinaryOpsMatchCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    const double tol = tolerance(dt);
    const Tensor a = random_tensor({64, 65}, dt, false, 0.5, 3.0), b = random_tensor({64, 65}, dt, false, -2.0, 2.0);
    const Tensor ag = a.to(kGpu), bg = b.to(kGpu);
    EXPECT_TRUE(same_bytes(sub(ag, bg), sub(a, b)));
    EXPECT_TRUE(same_bytes(mul(ag, bg), mul(a, b)));
    EXPECT_TRUE(all_close(div(ag, bg), div(a, b), tol, tol));
    EXPECT_TRUE(all_close(pow(ag, bg), pow(a, b), tol, tol));
    EXPECT_TRUE(same_bytes(maximum(ag, bg.slice(0, 0, 1)), maximum(a, b.slice(0, 0, 1))));
    EXPECT_TRUE(same_bytes(minimum(ag.t(), bg.t()), minimum(a.t(), b.t())));
    EXPECT_TRUE(same_bytes(ag * 2.5, a * 2.5));
    EXPECT_TRUE(same_bytes(ag + 0.25, a + 0.25));
    EXPECT_TRUE(same_bytes(ag.t() - 1.0, a.t() - 1.0));
  }
  // maximum propagates NaN on the device as on the host
  const Tensor x = from_vector<float>({1.f, NAN, 3.f, 4.f, 5.f}), y = from_vector<float>({2.f, 0.f, NAN, 1.f, 9.f});
  const auto got = maximum(x.to(kGpu), y.to(kGpu)).to_vector<float>();
  EXPECT_EQ(got[0], 2.f);
  EXPECT_TRUE(std::isnan(got[1]));
  EXPECT_TRUE(std::isnan(got[2]));
  EXPECT_EQ(got[3], 4.f);
  // integer and bool arithmetic
  const Tensor i = randint(-100, 100, {50}), j = randint(-100, 100, {50});
  EXPECT_TRUE(same_bytes(mul(i.to(kGpu), j.to(kGpu)), mul(i, j)));
  const Tensor p = from_vector<bool>({true, false, true, false}), q = from_vector<bool>({true, true, false, false});
  EXPECT_EQ(add(p.to(kGpu), q.to(kGpu)).to_vector<bool>(), (std::vector<bool>{true, true, true, false}));
  EXPECT_EQ(mul(p.to(kGpu), q.to(kGpu)).to_vector<bool>(), (std::vector<bool>{true, false, false, false}));
}

TEST(CudaBasics, RandomDrawsEqualCpuForTheSameSeed) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = ember::testing::test_seed();
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    manual_seed(seed);
    const Tensor c1 = rand({1001}, {dt}), c2 = rand({3, 77}, {dt});
    manual_seed(seed);
    const Tensor g1 = rand({1001}, {dt, kGpu}), g2 = rand({3, 77}, {dt, kGpu});
    EXPECT_TRUE(same_bytes(g1, c1));
    EXPECT_TRUE(same_bytes(g2, c2));  // the generator advanced by the same count on both
    // Box-Muller uses log and cos, whose device versions may differ in a double's last bit
    manual_seed(seed);
    const Tensor cn = randn({4096}, {dt});
    manual_seed(seed);
    const Tensor gn = randn({4096}, {dt, kGpu});
    const double tol = dt == DType::f64 ? 1e-13 : tolerance(dt);
    EXPECT_TRUE(all_close(gn, cn, tol, tol));
    // an arbitrary range exercises a + (b - a) * u
    Generator hg(seed), dg(seed);
    Tensor hu = empty({999}, {dt}), du = empty({999}, {dt, kGpu});
    native::random_fill(hu, native::RandomKind::Uniform, -3.0, 5.0, hg);
    native::random_fill(du, native::RandomKind::Uniform, -3.0, 5.0, dg);
    EXPECT_TRUE(same_bytes(du, hu));
  }
  for (DType dt : {DType::i64, DType::i32}) {
    manual_seed(seed);
    const Tensor c = randint(-7, 1000000, {2048}, {dt});
    manual_seed(seed);
    const Tensor g = randint(-7, 1000000, {2048}, {dt, kGpu});
    EXPECT_TRUE(same_bytes(g, c)) << dtype_name(dt);
  }
}

// The caching allocator's rules (kernels/cuda/block_pool.h): requests round up to 512 bytes;
// up to 1 MiB they share 2 MiB segments, 1-10 MiB requests share 20 MiB segments, larger ones
// get a segment of their own rounded up to 2 MiB; a free block is handed out best fit and split
// when much larger than asked, and freed blocks merge back with their free neighbours.
TEST(CudaBasics, AllocatorReusesFreedBlocks) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  using cuda::BlockPool;
  constexpr int64_t kMiB = int64_t(1) << 20;
  static_assert(BlockPool::kSmallSegment == 2 * kMiB && BlockPool::kMediumSegment == 20 * kMiB,
                "the segment sizes the README documents");
  const auto segments = [] { return cuda::cuda_allocator().segment_count(0); };
  const auto floats = [](int64_t n) { return empty({n}, {DType::f32, kGpu}); };
  const auto at = [](const Tensor& t) { return static_cast<const char*>(t.raw_data()); };
  cuda_synchronize();
  cuda_empty_cache();
  const AllocatorStats s0 = cuda_memory_stats();
  const int64_t seg0 = segments();

  // A 4 MiB request is a medium one: it takes the start of a fresh 20 MiB segment.
  const int64_t medium = 4 * kMiB;
  ASSERT_EQ(BlockPool::segment_size(BlockPool::round_size(size_t(medium))), size_t(20 * kMiB));
  const char* base = nullptr;
  {
    const Tensor t = floats(medium / 4);
    base = at(t);
    const AllocatorStats s = cuda_memory_stats();
    EXPECT_EQ(s.bytes_in_use, s0.bytes_in_use + medium);
    EXPECT_EQ(s.bytes_reserved, s0.bytes_reserved + 20 * kMiB);
    EXPECT_EQ(segments(), seg0 + 1);
    EXPECT_EQ(s.num_allocations, s0.num_allocations + 1);
    EXPECT_EQ(s.num_cache_hits, s0.num_cache_hits);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % 256, 0u) << "segments start 256-byte aligned";
  }
  const AllocatorStats s1 = cuda_memory_stats();
  EXPECT_EQ(s1.bytes_in_use, s0.bytes_in_use);
  EXPECT_EQ(s1.bytes_reserved, s0.bytes_reserved + 20 * kMiB) << "the freed block stays cached";
  EXPECT_GE(s1.peak_bytes_in_use, s0.bytes_in_use + medium);

  // Freed, it merged back into the whole segment: the same request, and one 28 bytes smaller
  // (the same 512-byte multiple), get the segment's start again from the cache.
  {
    const Tensor t = floats(medium / 4);
    EXPECT_EQ(at(t), base);
  }
  {
    const Tensor t = floats(medium / 4 - 7);
    EXPECT_EQ(at(t), base);
  }
  const AllocatorStats s2 = cuda_memory_stats();
  EXPECT_EQ(s2.num_cache_hits, s1.num_cache_hits + 2);
  EXPECT_EQ(s2.bytes_reserved, s1.bytes_reserved);

  // Live blocks split the segment back to back: five 4 MiB blocks fill it exactly, and a sixth
  // needs a second segment from the driver.
  {
    std::vector<Tensor> live;
    for (int i = 0; i < 5; ++i) live.push_back(floats(medium / 4));
    for (int i = 0; i < 5; ++i) EXPECT_EQ(at(live[size_t(i)]), base + i * medium) << "block " << i;
    const AllocatorStats s = cuda_memory_stats();
    EXPECT_EQ(s.bytes_in_use, s0.bytes_in_use + 5 * medium);
    EXPECT_EQ(s.bytes_reserved, s0.bytes_reserved + 20 * kMiB);
    EXPECT_EQ(segments(), seg0 + 1);
    live.push_back(floats(medium / 4));
    EXPECT_EQ(cuda_memory_stats().bytes_reserved, s0.bytes_reserved + 40 * kMiB);
    EXPECT_EQ(segments(), seg0 + 2);
  }
  // Best fit: with a 20 MiB free block and a 4 MiB one, a 4 MiB request takes the 4 MiB one.
  {
    const Tensor keep = floats(medium / 4);  // the start of one segment
    std::vector<Tensor> rest;
    for (int i = 0; i < 4; ++i) rest.push_back(floats(medium / 4));
    const char* hole = at(rest[1]);
    rest.erase(rest.begin() + 1);  // a 4 MiB hole between live blocks
    const Tensor t = floats(medium / 4);
    EXPECT_EQ(at(t), hole);
  }

  // A large request (above 10 MiB) gets a segment of its own, rounded up to 2 MiB.
  cuda_empty_cache();
  EXPECT_EQ(segments(), seg0);
  {
    const int64_t large = 12 * kMiB + 4;  // rounds to 12 MiB + 512 bytes; its segment is 14 MiB
    ASSERT_EQ(BlockPool::segment_size(BlockPool::round_size(size_t(large))), size_t(14 * kMiB));
    const Tensor t = floats(large / 4);
    const AllocatorStats s = cuda_memory_stats();
    EXPECT_EQ(s.bytes_in_use, s0.bytes_in_use + 12 * kMiB + 512);
    EXPECT_EQ(s.bytes_reserved, s0.bytes_reserved + 14 * kMiB);
    EXPECT_EQ(segments(), seg0 + 1);
  }

  // Small requests share a 2 MiB segment, each rounded to 512 bytes, side by side.
  cuda_empty_cache();
  {
    const Tensor a = floats(1000);  // 4000 bytes: a 4096-byte block
    const Tensor b = floats(1000);
    const Tensor c = floats(1);     // 4 bytes: one 512-byte block
    const AllocatorStats s = cuda_memory_stats();
    EXPECT_EQ(s.bytes_in_use, s0.bytes_in_use + 2 * 4096 + 512);
    EXPECT_EQ(s.bytes_reserved, s0.bytes_reserved + 2 * kMiB);
    EXPECT_EQ(segments(), seg0 + 1);
    EXPECT_EQ(at(b), at(a) + 4096);
    EXPECT_EQ(at(c), at(b) + 4096);
  }

  cuda_reset_peak_memory_stats();
  EXPECT_EQ(cuda_memory_stats().peak_bytes_in_use, s0.bytes_in_use);
  cuda_empty_cache();
  const AllocatorStats s4 = cuda_memory_stats();
  EXPECT_EQ(s4.bytes_reserved, s0.bytes_reserved) << "every wholly free segment went back";
  EXPECT_EQ(s4.bytes_in_use, s0.bytes_in_use);
  EXPECT_EQ(segments(), seg0);
}

// A tensor's memory comes from the device it names, whatever device is current, and the
// current device is left as it was; a device that does not exist is refused by name.
TEST(CudaBasics, AllocationsLandOnTheRequestedDevice) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const int n = cuda_device_count();
  EXPECT_EMBER_ERROR(empty({4}, {DType::f32, Device::cuda(n)}), "invalid CUDA device index " + std::to_string(n));
  EXPECT_EQ(cuda_current_device(), 0);
  for (int want = 0; want < n; ++want) {
    for (int current = 0; current < n; ++current) {
      SCOPED_TRACE("tensor on cuda:" + std::to_string(want) + ", cuda:" + std::to_string(current) + " current");
      cuda_set_device(current);
      const Tensor t = full({1000}, 2.0, {DType::f32, Device::cuda(want)});
      EXPECT_EQ(cuda_current_device(), current);
      cudaPointerAttributes attr{};
      ASSERT_EQ(cudaPointerGetAttributes(&attr, t.raw_data()), cudaSuccess);
      EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
      EXPECT_EQ(attr.device, want);
      EXPECT_EQ(t.to(Device::cpu()).to_vector<float>()[999], 2.0f);
    }
  }
  cuda_set_device(0);
}

TEST(CudaBasics, DeviceErrorsAreClear) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  EXPECT_GE(cuda_device_count(), 1);
  EXPECT_EQ(cuda_current_device(), 0);
  const int n = cuda_device_count();
  EXPECT_EMBER_ERROR(cuda_set_device(n), "invalid CUDA device index " + std::to_string(n));
  EXPECT_EMBER_ERROR(cuda_memory_stats(n + 3), "invalid CUDA device index");
  EXPECT_EMBER_ERROR(add(ones({2}).to(kGpu), ones({2})), "add", "cuda:0", "cpu");
}

// Meaningful only on a machine without a GPU (as CI is): using the device must raise, not abort.
TEST(CudaBasics, WithoutDeviceMakingCudaTensorsRaises) {
  if (ember::cuda_is_available()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(cuda_device_count(), 0);
  EXPECT_EMBER_ERROR(empty({2, 3}, {DType::f32, Device::cuda()}), "CUDA");
  EXPECT_EMBER_ERROR(zeros({4}, {DType::f16, Device::cuda()}), "CUDA");
  EXPECT_EMBER_ERROR(ones({4}).to(Device::cuda()), "CUDA");
  EXPECT_EMBER_ERROR(rand({3}, {DType::f32, Device::cuda()}), "CUDA");
  EXPECT_EMBER_ERROR(cuda_synchronize(), "CUDA");
  EXPECT_EMBER_ERROR(cuda_memory_stats(), "CUDA");
  EXPECT_EMBER_ERROR(cuda_current_device(), "CUDA");
  cuda_empty_cache();  // nothing to give back: a no-op, not an error
  // the host side keeps working after the failures
  EXPECT_EQ(add(ones({3}), ones({3})).to_vector<float>(), std::vector<float>(3, 2.0f));
}
