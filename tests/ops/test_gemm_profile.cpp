// cpu::gemm's per-product timing (kernels/cpu/gemm_profile.h): which calls it counts, under which
// shape, layout and kernel, and that it counts nothing when off.
#include "test_util.h"

#include <algorithm>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_f32_path.h"
#include "kernels/cpu/gemm_profile.h"

using namespace ember;

namespace {

// Profiling on for one test, the table empty at its start and its end.
struct ProfileOn {
  ProfileOn() {
    cpu::set_gemm_profile(true);
    cpu::clear_gemm_profile();
  }
  ~ProfileOn() {
    cpu::set_gemm_profile(false);
    cpu::clear_gemm_profile();
  }
};

const cpu::GemmProfileRow* find_row(const std::vector<cpu::GemmProfileRow>& rows, int64_t m, int64_t n, int64_t k,
                                    bool bias) {
  for (const auto& r : rows)
    if (r.m == m && r.n == n && r.k == k && r.bias == bias) return &r;
  return nullptr;
}

}  // namespace

TEST(GemmProfile, CountsEachF32ProductByShapeLayoutAndKernel) {
  ProfileOn on;
  const int64_t m = 48, n = 64, k = 40;
  std::vector<float> a(size_t(m * k), 0.5f), b(size_t(k * n), 0.25f), c(size_t(m * n)), bias(size_t(n), 1.0f);
  for (int i = 0; i < 3; ++i)
    cpu::gemm<float>(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
  cpu::gemm_bias(false, true, m, n, k, a.data(), k, b.data(), k, bias.data(), c.data(), n);
  EXPECT_FLOAT_EQ(c[0], 1.0f + 0.125f * float(k));  // the bias product ran as well as being counted
  std::vector<double> ad(size_t(m * k), 1.0), bd(size_t(k * n), 1.0), cd(size_t(m * n));
  cpu::gemm<double>(false, false, m, n, k, 1.0, ad.data(), k, bd.data(), n, 0.0, cd.data(), n);  // not counted

  const auto rows = cpu::gemm_profile_rows();
  ASSERT_EQ(rows.size(), 2u);
  const cpu::GemmProfileRow* plain = find_row(rows, m, n, k, false);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->calls, 3);
  EXPECT_FALSE(plain->trans_a || plain->trans_b || plain->in_parallel);
  EXPECT_EQ(plain->kernel, cpu::f32_gemm_path_name(cpu::f32_gemm_path_for(m, n, k, false, false)));
  EXPECT_GT(plain->seconds, 0.0);
  EXPECT_GT(plain->gflops(), 0.0);
  const cpu::GemmProfileRow* with_bias = find_row(rows, m, n, k, true);
  ASSERT_NE(with_bias, nullptr);
  EXPECT_EQ(with_bias->calls, 1);
  EXPECT_TRUE(with_bias->trans_b);
  EXPECT_EQ(with_bias->kernel, cpu::f32_gemm_path_name(cpu::f32_gemm_path_for(m, n, k, false, true)));
}

TEST(GemmProfile, ProductsInsideAParallelRegionAreMarkedAsOneThreads) {
  ProfileOn on;
  const int saved = get_num_threads();
  set_num_threads(2);
  const int64_t heads = 4, m = 32, n = 32, k = 16;
  std::vector<float> a(size_t(heads * m * k), 1.0f), b(size_t(heads * k * n), 1.0f), c(size_t(heads * m * n));
  parallel_for(0, heads, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h)
      cpu::gemm<float>(false, false, m, n, k, 1.0f, a.data() + h * m * k, k, b.data() + h * k * n, n, 0.0f,
                       c.data() + h * m * n, n);
  });
  set_num_threads(saved);
  const auto rows = cpu::gemm_profile_rows();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].calls, heads);
  EXPECT_TRUE(rows[0].in_parallel);
  EXPECT_TRUE(std::all_of(c.begin(), c.end(), [&](float x) { return x == float(k); }));
}

TEST(GemmProfile, CountsNothingWhenOff) {
  cpu::set_gemm_profile(false);
  cpu::clear_gemm_profile();
  std::vector<float> a(64, 1.0f), b(64, 1.0f), c(64);
  cpu::gemm<float>(false, false, 8, 8, 8, 1.0f, a.data(), 8, b.data(), 8, 0.0f, c.data(), 8);
  EXPECT_TRUE(cpu::gemm_profile_rows().empty());
}
