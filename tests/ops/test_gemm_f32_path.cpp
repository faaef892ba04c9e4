// The f32 GEMM's kernels (kernels/cpu/gemm_f32_path.h): the automatic choice by size and by
// what is installed, and matmul and linear giving the reference's results on every path forced.
#include "test_util.h"

#include <optional>
#include <tuple>
#include <vector>

#include "kernels/cpu/gemm_f32_path.h"
#include "kernels/cpu/gemm_packed.h"
#include "kernels/cpu/mkl_sgemm.h"

using namespace ember;

namespace {

// Restores the automatic choice however a test ends.
struct ForcedF32Path {
  explicit ForcedF32Path(cpu::F32GemmPath path) { cpu::set_f32_gemm_path(path); }
  ~ForcedF32Path() { cpu::set_f32_gemm_path(std::nullopt); }
};

// A [m, k] x [k, n] product on one path against the same product in f64.
void expect_path_matches_f64(cpu::F32GemmPath path, int64_t m, int64_t k, int64_t n) {
  const Tensor a = ember::testing::random_tensor({m, k}, DType::f32);
  const Tensor w = ember::testing::random_tensor({n, k}, DType::f32);
  const Tensor expected = matmul(a.to(DType::f64), w.to(DType::f64).t());
  ForcedF32Path forced(path);
  const Tensor got = matmul(a, w.t());
  EXPECT_TRUE(ember::testing::all_close(got.to(DType::f64), expected, 1e-4, 1e-4))
      << cpu::f32_gemm_path_name(path) << " " << m << "x" << k << "x" << n;
}

// Every path this machine can run (MKL where it is installed).
std::vector<cpu::F32GemmPath> runnable_paths() {
  std::vector<cpu::F32GemmPath> paths{cpu::F32GemmPath::OneDnn, cpu::F32GemmPath::Packed};
  if (cpu::mkl_status().loaded) paths.push_back(cpu::F32GemmPath::Mkl);
  return paths;
}

}  // namespace

TEST(F32GemmPath, MklIsNeverTheAutomaticChoiceButCanBeForced) {
  cpu::set_f32_gemm_path(std::nullopt);
  for (const auto& [m, n, k, trans_a] : {std::tuple{128, 128, 64, false}, std::tuple{2048, 1024, 256, false},
                                          std::tuple{30522, 256, 2048, true}, std::tuple{3072, 768, 2048, true}})
    EXPECT_NE(cpu::f32_gemm_path_for(m, n, k, trans_a, false), cpu::F32GemmPath::Mkl) << m << "x" << n << "x" << k;
  ForcedF32Path forced(cpu::F32GemmPath::Mkl);
  EXPECT_EQ(cpu::f32_gemm_path_for(2048, 1024, 256, false, true), cpu::F32GemmPath::Mkl);
  EXPECT_STREQ(cpu::f32_gemm_path_name(cpu::F32GemmPath::Mkl), "mkl");
}

TEST(F32GemmPath, SmallProductsGoToOneDnnLargeOnesToThePackedGemm) {
  cpu::set_f32_gemm_path(std::nullopt);
  const bool avx2 = cpu::packed_kernel_for_this_cpu() == cpu::PackedKernel::Avx2;
  const cpu::F32GemmPath avx2_only = avx2 ? cpu::F32GemmPath::Packed : cpu::F32GemmPath::OneDnn;
  const cpu::F32GemmPath avx512_only = avx2 ? cpu::F32GemmPath::OneDnn : cpu::F32GemmPath::Packed;
  // One attention head: oneDNN, but where the AVX-512 packed GEMM reads both operands in place
  // (B not transposed, 32 to 128 columns).
  EXPECT_EQ(cpu::f32_gemm_path_for(128, 128, 64, false, true), cpu::F32GemmPath::OneDnn);  // Q K^T
  EXPECT_EQ(cpu::f32_gemm_path_for(128, 64, 128, false, false), avx512_only);              // P V
  EXPECT_EQ(cpu::f32_gemm_path_for(128, 64, 128, true, false), avx512_only);               // P^T dO
  EXPECT_EQ(cpu::f32_gemm_path_for(128, 16, 128, false, false), cpu::F32GemmPath::OneDnn);  // narrower than a tile
  EXPECT_EQ(cpu::f32_gemm_path_for(64, 256, 64, false, false), cpu::F32GemmPath::OneDnn);   // wider than kInPlaceMaxN
  // Large products: the packed GEMM where its AVX2 kernel runs; where its AVX-512 kernel runs,
  // only the tall narrow ones with a transposed A (weight gradients of 256-wide layers: an FFN's
  // and the MLM decoder's, not the attention projections'), as measured.
  EXPECT_EQ(cpu::f32_gemm_path_for(2048, 1024, 256, false, true), avx2_only);
  EXPECT_EQ(cpu::f32_gemm_path_for(2048, 30522, 256, false, true), avx2_only);
  EXPECT_EQ(cpu::f32_gemm_path_for(256, 1024, 2048, true, false), avx2_only);
  EXPECT_EQ(cpu::f32_gemm_path_for(3072, 768, 2048, true, false), avx2_only);
  EXPECT_EQ(cpu::f32_gemm_path_for(30522, 256, 2048, true, false), cpu::F32GemmPath::Packed);
  EXPECT_EQ(cpu::f32_gemm_path_for(1024, 256, 2048, true, false), cpu::F32GemmPath::Packed);
  EXPECT_EQ(cpu::f32_gemm_path_for(768, 256, 2048, true, false), avx2_only);
  EXPECT_EQ(cpu::f32_gemm_path_for(256, 256, 2048, true, false), avx2_only);
  ForcedF32Path forced(cpu::F32GemmPath::OneDnn);
  EXPECT_EQ(cpu::f32_gemm_path_for(2048, 1024, 256, false, true), cpu::F32GemmPath::OneDnn);
  EXPECT_EQ(cpu::f32_gemm_path_for(30522, 256, 2048, true, false), cpu::F32GemmPath::OneDnn);
  EXPECT_EQ(cpu::f32_gemm_path_for(128, 64, 128, false, false), cpu::F32GemmPath::OneDnn);
}

TEST(F32GemmPath, EveryPathMatchesAnF64ProductAtTrainingShapes) {
  for (cpu::F32GemmPath path : runnable_paths()) {
    expect_path_matches_f64(path, 256, 128, 320);  // above the size threshold
    expect_path_matches_f64(path, 37, 19, 53);     // odd, below it
  }
}

TEST(F32GemmPath, LinearGradientsAgreeAcrossPaths) {
  const Tensor x0 = ember::testing::random_tensor({300, 96}, DType::f32);
  const Tensor w0 = ember::testing::random_tensor({160, 96}, DType::f32);
  const Tensor b0 = ember::testing::random_tensor({160}, DType::f32);
  std::vector<std::vector<Tensor>> grads;
  for (cpu::F32GemmPath path : runnable_paths()) {
    ForcedF32Path forced(path);
    Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
    sum(linear(x, w, b) * linear(x, w, b)).backward();
    grads.push_back({x.grad(), w.grad(), b.grad()});
  }
  for (size_t p = 1; p < grads.size(); ++p)
    for (size_t g = 0; g < 3; ++g)
      EXPECT_TRUE(ember::testing::all_close(grads[0][g], grads[p][g], 1e-4, 1e-3)) << "path " << p << " gradient " << g;
}
