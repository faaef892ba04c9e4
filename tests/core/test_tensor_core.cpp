// Tensor handle semantics, views, copies, dtype conversion, factories, RNG, allocator.
#include <algorithm>
#include <cmath>
#include <thread>

#include "test_util.h"

using namespace ember;
using ember::testing::all_close;

TEST(TensorCore, HandleSharesImplAndStorage) {
  Tensor a = zeros({2, 3});
  Tensor b = a;  // same impl
  b.fill_(2.0);
  EXPECT_EQ(a.to_vector<float>(), std::vector<float>(6, 2.0f));
  Tensor v = a.view({3, 2});
  v.select(0, 1).fill_(5.0);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{2, 2, 5, 5, 2, 2}));
  Tensor c = a.clone();
  c.fill_(0.0);
  EXPECT_EQ(a.to_vector<float>()[0], 2.0f);
}

TEST(TensorCore, ViewsHaveExpectedGeometry) {
  Tensor x = arange(24, {DType::f32}).view({2, 3, 4});
  EXPECT_EQ(x.strides(), (Shape{12, 4, 1}));
  Tensor t = x.transpose(0, 2);
  EXPECT_EQ(t.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(t.strides(), (Shape{1, 4, 12}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.contiguous().to_vector<float>()[1], 12.0f);
  Tensor p = x.permute({1, 2, 0});
  EXPECT_EQ(p.shape(), (Shape{3, 4, 2}));
  EXPECT_EQ(p.contiguous().to_vector<float>()[0 * 8 + 1 * 2 + 1], 13.0f);
  Tensor n = x.narrow(2, 1, 2);
  EXPECT_EQ(n.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(n.storage_offset(), 1);
  Tensor s = x.slice(1, 0, 3, 2);
  EXPECT_EQ(s.shape(), (Shape{2, 2, 4}));
  EXPECT_EQ(s.contiguous().to_vector<float>()[4], 8.0f);
  Tensor e = from_vector<float>({1, 2, 3}).view({3, 1}).expand({3, 4});
  EXPECT_EQ(e.strides(), (Shape{1, 0}));
  EXPECT_EQ(e.contiguous().to_vector<float>()[5], 2.0f);
  EXPECT_EQ(x.unsqueeze(1).shape(), (Shape{2, 1, 3, 4}));
  EXPECT_EQ(x.unsqueeze(-1).shape(), (Shape{2, 3, 4, 1}));
  EXPECT_EQ(zeros({1, 3, 1}).squeeze().shape(), (Shape{3}));
  EXPECT_EQ(zeros({1, 3, 1}).squeeze(2).shape(), (Shape{1, 3}));
  EXPECT_EQ(x.flatten(1).shape(), (Shape{2, 12}));
  // reshape of a non-viewable tensor copies, view refuses
  EXPECT_EMBER_ERROR(t.view({24}), "view", "reshape");
  EXPECT_EQ(t.reshape({24}).to_vector<float>()[1], 12.0f);
  EXPECT_EQ(x.reshape({-1, 6}).shape(), (Shape{4, 6}));
}

TEST(TensorCore, ViewErrorsNameTheOp) {
  Tensor x = zeros({2, 3});
  EXPECT_EMBER_ERROR(x.view({4, 2}), "view", "[4, 2]", "6");
  EXPECT_EMBER_ERROR(x.transpose(0, 2), "transpose", "dim 2");
  EXPECT_EMBER_ERROR(x.select(1, 3), "select", "index 3");
  EXPECT_EMBER_ERROR(x.expand({4, 3}), "expand", "[2, 3]", "[4, 3]");
  EXPECT_EMBER_ERROR(x.permute({0, 0}), "permute");
  EXPECT_EMBER_ERROR(x.narrow(1, 2, 2), "narrow");
  EXPECT_EMBER_ERROR(x.reshape({-1, -1}), "reshape");
  EXPECT_EMBER_ERROR(x.item<float>(), "item", "[2, 3]");
  EXPECT_EMBER_ERROR(x.data_ptr<double>(), "float64");
  EXPECT_EMBER_ERROR(zeros({-1}), "negative");
  EXPECT_EMBER_ERROR(Tensor().dim(), "undefined");
}

TEST(TensorCore, DTypeConversionRoundsToNearestEven) {
  // bf16: 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to the even (1.0).
  EXPECT_EQ(float(BFloat16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(float(BFloat16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  // f16: 1 + 2^-11 is halfway between 1 and 1 + 2^-10
  EXPECT_EQ(float(Half(1.0f + std::ldexp(1.0f, -11))), 1.0f);
  EXPECT_EQ(float(Half(1.0f + 3 * std::ldexp(1.0f, -11))), 1.0f + std::ldexp(1.0f, -9));
  EXPECT_EQ(float(Half(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(float(Half(65520.0f))));
  EXPECT_EQ(float(Half(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(float(Half(std::ldexp(1.0f, -26))), 0.0f);
  EXPECT_TRUE(std::isnan(float(Half(NAN))));
  EXPECT_TRUE(std::isnan(float(BFloat16(NAN))));
  // every f16 bit pattern survives float and back
  for (uint32_t b = 0; b < 65536; ++b) {
    Half h;
    h.bits = uint16_t(b);
    const float f = h;
    if (std::isnan(f)) continue;
    EXPECT_EQ(Half(f).bits, h.bits) << b;
  }
  Tensor x = from_vector<float>({1.5f, -2.25f, 3.0f});
  EXPECT_EQ(x.to(DType::bf16).to(DType::f32).to_vector<float>(), (std::vector<float>{1.5f, -2.25f, 3.0f}));
  EXPECT_EQ(x.to(DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(x.to(DType::boolean).to_vector<bool>(), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(x.to(DType::f16).select(0, 0).item_double(), 1.5);
}

TEST(TensorCore, FactoriesAndItem) {
  EXPECT_EQ(full({2}, 3.5).to_vector<float>(), (std::vector<float>{3.5f, 3.5f}));
  EXPECT_EQ(arange(5).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(1.0, 2.0, 0.25, {DType::f64}).to_vector<double>(), (std::vector<double>{1, 1.25, 1.5, 1.75}));
  EXPECT_EQ(arange(0).numel(), 0);
  EXPECT_EQ(scalar_tensor(7.0).item<float>(), 7.0f);
  EXPECT_EQ(ones({2, 0, 3}).numel(), 0);
  std::vector<float> raw = {1, 2, 3, 4};
  Tensor b = from_buffer(raw.data(), {2, 2}, DType::f32);
  raw[0] = 9;  // copied, not aliased
  EXPECT_EQ(b.to_vector<float>()[0], 1.0f);
  bool deleted = false;
  {
    Tensor blob = from_blob(raw.data(), {4}, DType::f32, [&](void*) { deleted = true; });
    EXPECT_EQ(blob.to_vector<float>()[0], 9.0f);
  }
  EXPECT_TRUE(deleted);
  EXPECT_EMBER_ERROR(from_vector<float>({1, 2, 3}, {2, 2}), "from_vector", "[2, 2]");
}

TEST(TensorCore, RandomIsSeededAndThreadCountIndependent) {
  manual_seed(123);
  Tensor a = randn({1000});
  Tensor u = rand({1000});
  manual_seed(123);
  const int saved = get_num_threads();
  set_num_threads(1);
  Tensor b = randn({1000});
  Tensor v = rand({1000});
  set_num_threads(saved);
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  EXPECT_EQ(u.to_vector<float>(), v.to_vector<float>());
  // the next draw differs (offset advanced)
  EXPECT_NE(randn({1000}).to_vector<float>(), a.to_vector<float>());
  // statistics
  auto nv = randn({200000}).to_vector<float>();
  double m = 0, s2 = 0;
  for (float x : nv) m += x;
  m /= double(nv.size());
  for (float x : nv) s2 += (x - m) * (x - m);
  s2 /= double(nv.size());
  EXPECT_NEAR(m, 0.0, 0.02);
  EXPECT_NEAR(s2, 1.0, 0.02);
  auto uv = rand({200000}).to_vector<float>();
  for (float x : uv) ASSERT_TRUE(x >= 0.0f && x < 1.0f);
  auto iv = randint(-3, 4, {10000}).to_vector<int64_t>();
  int64_t lo = 100, hi = -100;
  for (auto x : iv) lo = std::min(lo, x), hi = std::max(hi, x);
  EXPECT_EQ(lo, -3);
  EXPECT_EQ(hi, 3);
  EXPECT_EMBER_ERROR(randint(3, 3, {2}), "randint");
}

TEST(TensorCore, GeneratorStateRoundTrips) {
  Generator g(5);
  g.reserve(10);
  GeneratorState s = g.get_state();
  EXPECT_EQ(s.seed, 5u);
  EXPECT_EQ(s.offset, 10u);
  g.reserve(3);
  g.set_state(s);
  EXPECT_EQ(g.get_state().offset, 10u);
}

TEST(TensorCore, AllocatorReusesFreedBlocks) {
  auto& alloc = cpu_allocator();
  { Tensor warm = empty({1 << 20}); }
  const AllocatorStats before = alloc.stats();
  for (int i = 0; i < 10; ++i) {
    Tensor t = empty({1 << 20});
  }
  const AllocatorStats after = alloc.stats();
  EXPECT_EQ(after.num_allocations - before.num_allocations, 10);
  EXPECT_EQ(after.num_cache_hits - before.num_cache_hits, 10);
  EXPECT_EQ(after.bytes_reserved, before.bytes_reserved);
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use);
  Tensor held = empty({1 << 20});
  EXPECT_GE(alloc.stats().bytes_in_use, before.bytes_in_use + (4 << 20));
  EXPECT_GE(alloc.stats().peak_bytes_in_use, alloc.stats().bytes_in_use);
  EXPECT_EQ(CpuCachingAllocator::round_size(1), 64u);
  EXPECT_EQ(CpuCachingAllocator::round_size(1000), 1024u);
  EXPECT_EQ(CpuCachingAllocator::round_size((1 << 20) + 1), (1u << 20) + (1u << 17));
}

TEST(TensorCore, AllocatorOutOfMemoryIsAnError) {
  EXPECT_EMBER_ERROR(empty({int64_t(1) << 50}), "out of memory", "bytes");
}

TEST(TensorCore, PrintingShowsValuesShapeAndDtype) {
  const std::string s = from_vector<float>({1, 2, 3, 4}, {2, 2}).str();
  EXPECT_NE(s.find("[[1, 2],"), std::string::npos) << s;
  EXPECT_NE(s.find("shape=[2, 2]"), std::string::npos) << s;
  EXPECT_NE(s.find("float32"), std::string::npos) << s;
  const std::string l = arange(100).str();
  EXPECT_NE(l.find("..."), std::string::npos) << l;
}

TEST(TensorCore, CopyBroadcastsAndConverts) {
  Tensor dst = zeros({2, 3}, {DType::f64});
  dst.copy_(from_vector<int32_t>({1, 2, 3}));
  EXPECT_EQ(dst.to_vector<double>(), (std::vector<double>{1, 2, 3, 1, 2, 3}));
  EXPECT_EMBER_ERROR(dst.copy_(zeros({4})), "copy_", "[4]", "[2, 3]");
  // strided destination
  Tensor big = zeros({3, 4});
  big.transpose(0, 1).narrow(0, 1, 2).copy_(ones({2, 3}));
  EXPECT_EQ(big.to_vector<float>(), (std::vector<float>{0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0}));
}

TEST(TensorCore, RandomNonContiguousHelperMatchesShape) {
  for (int i = 0; i < 20; ++i) {
    Shape s = ember::testing::random_shape(3, 4, true);
    Tensor t = ember::testing::random_tensor(s, DType::f32, true);
    EXPECT_EQ(t.shape(), s);
    if (t.numel() > 1 && s[1] > 1 && s[2] > 1) {
      EXPECT_FALSE(t.is_contiguous());
    }
  }
}
