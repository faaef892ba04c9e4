// CUDA matmul, bmm and linear (cuBLASLt, kernels/cuda/linalg_matmul.cu) against the double
// reference: every float dtype, operands laid out contiguous, transposed, padded, misaligned,
// strided (copied first), batch-permuted and batch-expanded; broadcast batch dims (folded into
// one GEMM, strided-batched, or copied contiguous first); 1-D operands; bias through the epilogue and
// through the accumulate fallback (also for a bias slice off the 16-byte boundary); odd sizes
// and n, k or m of 1; k == 0; the TF32 switch.
//
// Tolerances, as in tests/ops/test_linalg.cpp: entry (i, j) may be off by
//   (tol(out dtype) + tol(accumulation dtype) * sqrt(k)) * (|A| |B|)_ij
// (f16 and bf16 accumulate in f32); with TF32 on, f32 inputs are rounded to 10-bit mantissas,
// which adds up to 2 * 2^-11 of (|A| |B|)_ij. Every element of every result is checked, and
// outputs are allocated right after a NaN-filled block of the same size was freed to the
// caching allocator, so an element the kernel never wrote is likely to show as NaN. Every test
// skips without a CUDA device.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "core/device_api.h"
#include "core/native/linalg.h"
#include "kernels/cuda/cublas_handles.h"
#include "kernels/reference/linalg.h"
#include "linalg_check.h"
#include "test_util.h"

using namespace ember;
using ember::testing::kFloatTypes;
using ember::testing::Layout;
using ember::testing::layout_name;
using ember::testing::matmul_shapes;
using ember::testing::random_tensor;
using ember::testing::ref_abs;
using ember::testing::uniform_int;
using reference::RefTensor;

namespace {

const Device kGpu = Device::cuda(0);
const double kNaN = std::numeric_limits<double>::quiet_NaN();

// Sets the TF32 switch for a scope and restores it afterwards.
struct Tf32Scope {
  explicit Tf32Scope(bool on) : saved(cuda::allow_tf32()) { cuda::set_allow_tf32(on); }
  ~Tf32Scope() { cuda::set_allow_tf32(saved); }
  bool saved;
};

// Every element of got, which must be on the GPU, within the per-entry bound of want (see the
// top of the file).
::testing::AssertionResult product_close(const Tensor& got, const RefTensor& want, const RefTensor& scale,
                                         DType dtype, int64_t k, bool tf32 = false) {
  if (!got.is_cuda()) return ::testing::AssertionFailure() << "result is on " << got.device() << ", not CUDA";
  return ember::testing::product_close(got, want, scale, dtype, k, tf32);
}

// Frees a NaN-filled block of an output's size to the caching allocator, so the output
// allocated next most likely starts out as NaN.
void poison_next_output(const Shape& shape, DType dtype) { (void)full(shape, kNaN, {dtype, kGpu}); }

::testing::AssertionResult matmul_matches_reference(const Tensor& a, const Tensor& b, bool tf32 = false) {
  const RefTensor ra = reference::from_tensor(a), rb = reference::from_tensor(b);
  const RefTensor want = reference::matmul(ra, rb);
  poison_next_output(want.shape, a.dtype());
  const Tensor got = native::matmul(a, b);
  return product_close(got, want, reference::matmul(ref_abs(ra), ref_abs(rb)), a.dtype(), a.shape().back(), tf32);
}

const Layout kLayouts[] = {Layout::Contiguous, Layout::Transposed, Layout::Padded,        Layout::TransposedPadded,
                           Layout::Misaligned, Layout::Strided,    Layout::BatchPermuted, Layout::BatchExpanded};

Tensor gpu_operand(const Shape& shape, DType dtype, Layout layout) {
  return ember::testing::layout_operand(shape, dtype, layout, kGpu);
}

std::string label(DType dt, const Tensor& a, const Tensor& b) {
  return std::string(dtype_name(dt)) + " " + shape_str(a.shape()) + " strides " + shape_str(a.strides()) + " @ " +
         shape_str(b.shape()) + " strides " + shape_str(b.strides());
}

}  // namespace

TEST(CudaMatmul, EveryLayoutAndRankMatchesReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  Tf32Scope exact(false);
  const int ranks[][2] = {{2, 2}, {3, 3}, {3, 2}, {2, 3}, {4, 3}, {3, 4}, {4, 4}};
  for (DType dt : kFloatTypes) {
    for (const auto& r : ranks) {
      // Every layout of each operand, the other operand's layout drawn at random.
      for (int side = 0; side < 2; ++side) {
        for (Layout fixed : kLayouts) {
          const Layout other = kLayouts[uniform_int(0, int64_t(std::size(kLayouts)) - 1)];
          const Layout la = side == 0 ? fixed : other, lb = side == 0 ? other : fixed;
          const auto [sa, sb] = matmul_shapes(r[0], r[1], 24);
          const Tensor a = gpu_operand(sa, dt, la), b = gpu_operand(sb, dt, lb);
          SCOPED_TRACE(label(dt, a, b) + " (" + layout_name(la) + " @ " + layout_name(lb) + ")");
          EXPECT_TRUE(matmul_matches_reference(a, b));
        }
      }
    }
  }
}

TEST(CudaMatmul, OddSizesAndUnitDimsMatchReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  Tf32Scope exact(false);
  const int64_t sizes[] = {1, 7, 33, 129};
  for (DType dt : kFloatTypes)
    for (int64_t n : sizes)
      for (int64_t k : sizes)
        for (int64_t m : sizes) {
          const Tensor a = gpu_operand({n, k}, dt, Layout::Contiguous);
          const Tensor b = gpu_operand({k, m}, dt, (n + k + m) % 2 ? Layout::Transposed : Layout::Contiguous);
          SCOPED_TRACE(label(dt, a, b));
          EXPECT_TRUE(matmul_matches_reference(a, b));
        }
}

TEST(CudaMatmul, BroadcastBatchDimsMatchReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  Tf32Scope exact(false);
  const int64_t n = 9, k = 17, m = 13;
  // {a, b}: folded rows (b shared), strided-batched with a stride-0 operand, and batch dims
  // that no single stride covers (copied contiguous first).
  const std::pair<Shape, Shape> cases[] = {
      {{2, 3, n, k}, {k, m}},          {{2, 3, n, k}, {1, 1, k, m}},    {{4, n, k}, {1, k, m}},
      {{1, n, k}, {4, k, m}},          {{n, k}, {2, 3, k, m}},          {{2, 1, n, k}, {3, k, m}},
      {{2, 1, n, k}, {1, 3, k, m}},    {{3, 1, 2, n, k}, {1, 4, 2, k, m}}, {{5, n, k}, {5, k, m}},
  };
  for (DType dt : kFloatTypes)
    for (const auto& [sa, sb] : cases)
      for (Layout la : {Layout::Contiguous, Layout::Transposed}) {
        const Tensor a = gpu_operand(sa, dt, la), b = gpu_operand(sb, dt, Layout::Contiguous);
        SCOPED_TRACE(label(dt, a, b));
        EXPECT_TRUE(matmul_matches_reference(a, b));
      }
}

TEST(CudaMatmul, UnevenBatchStridesMatchReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  Tf32Scope exact(false);
  const int64_t n = 6, k = 11, m = 5;
  for (DType dt : kFloatTypes) {
    // Batch strides (s, 0): an expanded middle dim.
    const Tensor a1 = random_tensor({2, 1, n, k}, dt).to(kGpu).expand({2, 3, n, k});
    const Tensor b1 = gpu_operand({2, 3, k, m}, dt, Layout::Contiguous);
    // Batch dims in permuted order: strides that do not nest.
    const Tensor a2 = random_tensor({3, 2, n, k}, dt).to(kGpu).transpose(0, 1);
    const Tensor b2 = gpu_operand({2, 3, k, m}, dt, Layout::Transposed);
    // Three batch dims, the outer two swapped: the inner dim alone steps evenly.
    const Tensor a3 = random_tensor({3, 2, 4, n, k}, dt).to(kGpu).transpose(0, 1);
    const Tensor b3 = gpu_operand({2, 3, 4, k, m}, dt, Layout::Contiguous);
    for (const auto& [a, b] : {std::pair{a1, b1}, std::pair{a2, b2}, std::pair{a3, b3}, std::pair{b1.transpose(-1, -2),
                                                                                                  a1.transpose(-1, -2)}}) {
      SCOPED_TRACE(label(dt, a, b));
      EXPECT_TRUE(matmul_matches_reference(a, b));
    }
  }
}

TEST(CudaMatmul, OneDimensionalOperandsMatchReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  Tf32Scope exact(false);
  for (DType dt : kFloatTypes)
    for (int64_t k : {1, 33, 300}) {
      const std::pair<Shape, Shape> cases[] = {
          {{k}, {k}}, {{k}, {k, 7}}, {{5, k}, {k}}, {{3, 5, k}, {k}}, {{k}, {2, k, 6}}, {{k}, {k, 1}}, {{1, k}, {k}},
      };
      for (const auto& [sa, sb] : cases) {
        const Tensor a = gpu_operand(sa, dt, Layout::Contiguous), b = gpu_operand(sb, dt, Layout::Contiguous);
        SCOPED_TRACE(label(dt, a, b));
        EXPECT_TRUE(matmul_matches_reference(a, b));
      }
      // A 1-D operand that is a strided view.
      const Tensor v = random_tensor({k, 3}, dt).to(kGpu).select(1, 1);
      const Tensor w = gpu_operand({4, k}, dt, Layout::Transposed);
      SCOPED_TRACE(label(dt, w, v));
      EXPECT_TRUE(matmul_matches_reference(w, v));
      EXPECT_TRUE(matmul_matches_reference(v, w.transpose(0, 1)));
    }
}

TEST(CudaMatmul, EmptyInnerDimGivesZeros) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a = empty({2, 3, 0}, {dt, kGpu}), b = empty({0, 4}, {dt, kGpu});
    poison_next_output({2, 3, 4}, dt);
    const Tensor out = native::matmul(a, b);
    ASSERT_EQ(out.shape(), (Shape{2, 3, 4}));
    for (double v : out.to_vector<double>()) EXPECT_EQ(v, 0.0);
    // Empty outputs launch nothing.
    EXPECT_EQ(native::matmul(empty({0, 5}, {dt, kGpu}), empty({5, 3}, {dt, kGpu})).shape(), (Shape{0, 3}));
    EXPECT_EQ(native::matmul(empty({4, 5}, {dt, kGpu}), empty({5, 0}, {dt, kGpu})).shape(), (Shape{4, 0}));
  }
}

TEST(CudaBmm, MatchesReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  Tf32Scope exact(false);
  for (DType dt : kFloatTypes)
    for (Layout la : kLayouts)
      for (Layout lb : {Layout::Contiguous, Layout::Transposed, Layout::BatchPermuted}) {
        const int64_t batch = uniform_int(1, 5), n = uniform_int(1, 40), k = uniform_int(1, 40), m = uniform_int(1, 40);
        const Tensor a = gpu_operand({batch, n, k}, dt, la), b = gpu_operand({batch, k, m}, dt, lb);
        SCOPED_TRACE(label(dt, a, b));
        const RefTensor ra = reference::from_tensor(a), rb = reference::from_tensor(b);
        poison_next_output({batch, n, m}, dt);
        EXPECT_TRUE(product_close(native::bmm(a, b), reference::bmm(ra, rb),
                                  reference::bmm(ref_abs(ra), ref_abs(rb)), dt, k));
      }
}

TEST(CudaLinear, MatchesReferenceWithAndWithoutBias) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  Tf32Scope exact(false);
  const int64_t in = 37, out = 29;
  // x shapes; the last is a view whose batch dims do not stack its rows (strided-batched
  // with the weight shared through a zero stride, bias broadcast over the batch).
  const Shape x_shapes[] = {{in}, {1, in}, {8, in}, {2, 5, in}};
  for (DType dt : kFloatTypes)
    for (bool with_bias : {true, false})
      for (bool weight_transposed : {false, true})
        for (int xi = 0; xi < 5; ++xi) {
          const Tensor x = xi < 4 ? gpu_operand(x_shapes[xi], dt, Layout::Contiguous)
                                  : random_tensor({5, 2, in}, dt).to(kGpu).transpose(0, 1);
          const Tensor w = weight_transposed ? random_tensor({in, out}, dt).to(kGpu).transpose(0, 1)
                                             : random_tensor({out, in}, dt).to(kGpu);
          const Tensor b = with_bias ? random_tensor({out}, dt).to(kGpu) : Tensor();
          SCOPED_TRACE(std::string(dtype_name(dt)) + " x " + shape_str(x.shape()) + " strides " +
                       shape_str(x.strides()) + ", weight strides " + shape_str(w.strides()) + ", bias " +
                       std::to_string(with_bias));
          const RefTensor rx = reference::from_tensor(x), rw = reference::from_tensor(w);
          const RefTensor rb = with_bias ? reference::from_tensor(b) : RefTensor();
          const RefTensor want = reference::linear(rx, rw, rb, with_bias);
          poison_next_output(want.shape, dt);
          EXPECT_TRUE(product_close(native::linear(x, w, b), want,
                                    reference::linear(ref_abs(rx), ref_abs(rw), ref_abs(rb), with_bias), dt, in + 1));
        }
}

// A bias that is a slice at an element offset starts off the 16-byte boundary cuBLASLt's bias
// epilogue reads with vector loads: the product must take the accumulate path instead, give
// the reference's answer, and leave the context healthy (a misaligned read would be a sticky
// error that fails every later call).
TEST(CudaLinear, MisalignedBiasSliceMatchesReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  Tf32Scope exact(false);
  const int64_t rows = 128, in = 256, out = 384;  // sizes cuBLASLt has epilogue kernels for
  for (DType dt : kFloatTypes) {
    for (int64_t offset : {0, 1, 2, 3, 4, 5, 8}) {
      const Tensor x = random_tensor({rows, in}, dt).to(kGpu);
      const Tensor w = random_tensor({out, in}, dt).to(kGpu);
      const Tensor b = random_tensor({out + 16}, dt).to(kGpu).narrow(0, offset, out);
      const uintptr_t address = reinterpret_cast<uintptr_t>(b.raw_data());
      SCOPED_TRACE(std::string(dtype_name(dt)) + " bias at element offset " + std::to_string(offset) +
                   ", address % 16 = " + std::to_string(address % 16));
      const RefTensor rx = reference::from_tensor(x), rw = reference::from_tensor(w), rb = reference::from_tensor(b);
      const RefTensor want = reference::linear(rx, rw, rb, true);
      poison_next_output(want.shape, dt);
      EXPECT_TRUE(product_close(native::linear(x, w, b), want,
                                reference::linear(ref_abs(rx), ref_abs(rw), ref_abs(rb), true), dt, in + 1));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "the product left an error behind";
    }
  }
  // a batched input ([B, S, H] folded into one GEMM) with the misaligned bias too
  const Tensor x = random_tensor({3, 50, in}).to(kGpu), w = random_tensor({out, in}).to(kGpu);
  const Tensor b = random_tensor({out + 1}).to(kGpu).narrow(0, 1, out);
  const RefTensor rx = reference::from_tensor(x), rw = reference::from_tensor(w), rb = reference::from_tensor(b);
  EXPECT_TRUE(product_close(native::linear(x, w, b), reference::linear(rx, rw, rb, true),
                            reference::linear(ref_abs(rx), ref_abs(rw), ref_abs(rb), true), DType::f32, in + 1));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(CudaLinear, BiasWithEmptyInnerDimFillsEveryRow) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor bias = random_tensor({6}, dt);
    poison_next_output({3, 4, 6}, dt);
    const Tensor y = native::linear(empty({3, 4, 0}, {dt, kGpu}), empty({6, 0}, {dt, kGpu}), bias.to(kGpu));
    ASSERT_EQ(y.shape(), (Shape{3, 4, 6}));
    const std::vector<double> got = y.to_vector<double>(), want = bias.to_vector<double>();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i % 6]) << "at flat index " << i;
  }
}

TEST(CudaLinear, LongInnerDimKeepsF32Accumulation) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  Tf32Scope exact(false);
  // Few outputs and a long k invite split-K; partial sums must stay in f32 for 16-bit types.
  const int64_t shapes[][3] = {{4, 8192, 4}, {96, 2048, 160}, {300, 520, 260}};  // rows, in, out
  for (DType dt : kFloatTypes)
    for (const auto& s : shapes) {
      const Tensor x = random_tensor({s[0], s[1]}, dt, false, -1.0, 1.0).to(kGpu);
      const Tensor w = random_tensor({s[2], s[1]}, dt, false, -1.0, 1.0).to(kGpu);
      const Tensor b = random_tensor({s[2]}, dt).to(kGpu);
      SCOPED_TRACE(std::string(dtype_name(dt)) + " rows " + std::to_string(s[0]) + " in " + std::to_string(s[1]) +
                   " out " + std::to_string(s[2]));
      const RefTensor rx = reference::from_tensor(x), rw = reference::from_tensor(w), rb = reference::from_tensor(b);
      poison_next_output({s[0], s[2]}, dt);
      EXPECT_TRUE(product_close(native::linear(x, w, b), reference::linear(rx, rw, rb, true),
                                reference::linear(ref_abs(rx), ref_abs(rw), ref_abs(rb), true), dt, s[1] + 1));
    }
}

TEST(CudaLinear, LeadingDimsFarAboveRowsAndVeryLongRowsMatchReference) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  Tf32Scope exact(false);
  for (DType dt : kFloatTypes) {
    // Operands sliced out of much wider buffers (leading dims 25272 and 3000 for 128 and 64
    // rows), and a 131071-long k, each with a bias.
    const Tensor w_slice = random_tensor({128, 25272}, dt).to(kGpu).narrow(1, 21940, 2400);
    const Tensor x_rows = random_tensor({64, 2400}, dt).to(kGpu);
    const Tensor x_cols = random_tensor({2400, 3000}, dt).to(kGpu).narrow(1, 500, 64).transpose(0, 1);
    const Tensor w_plain = random_tensor({128, 2400}, dt).to(kGpu);
    const Tensor x_long = random_tensor({32, 131071}, dt, false, -1.0, 1.0).to(kGpu);
    const Tensor w_long = random_tensor({16, 131071}, dt, false, -1.0, 1.0).to(kGpu);
    const std::pair<Tensor, Tensor> cases[] = {{x_rows, w_slice}, {x_cols, w_plain}, {x_cols, w_slice}, {x_long, w_long}};
    for (const auto& [x, w] : cases) {
      const Tensor b = random_tensor({w.shape()[0]}, dt).to(kGpu);
      SCOPED_TRACE(std::string(dtype_name(dt)) + " x " + shape_str(x.shape()) + " strides " + shape_str(x.strides()) +
                   ", weight " + shape_str(w.shape()) + " strides " + shape_str(w.strides()));
      const RefTensor rx = reference::from_tensor(x), rw = reference::from_tensor(w), rb = reference::from_tensor(b);
      const RefTensor want = reference::linear(rx, rw, rb, true);
      poison_next_output(want.shape, dt);
      EXPECT_TRUE(product_close(native::linear(x, w, b), want,
                                reference::linear(ref_abs(rx), ref_abs(rw), ref_abs(rb), true), dt, x.shape()[1] + 1));
    }
  }
}

TEST(CudaMatmul, AlignmentIsPartOfTheAlgorithmChoice) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  Tf32Scope exact(false);
  // The same shape and leading dims, first from aligned then from misaligned pointers: an
  // algorithm chosen for the first must not be reused for the second.
  for (DType dt : kFloatTypes)
    for (int64_t size : {64, 256}) {
      for (Layout l : {Layout::Contiguous, Layout::Misaligned, Layout::Contiguous}) {
        const Tensor a = gpu_operand({size, size}, dt, l), b = gpu_operand({size, size}, dt, l);
        SCOPED_TRACE(label(dt, a, b) + " " + layout_name(l));
        EXPECT_TRUE(matmul_matches_reference(a, b));
      }
    }
}

TEST(CudaMatmul, RepeatedProductsAreBitwiseEqual) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a = gpu_operand({3, 70, 300}, dt, Layout::Contiguous);
    const Tensor b = gpu_operand({300, 90}, dt, Layout::Transposed);
    const std::vector<double> first = native::matmul(a, b).to_vector<double>();
    const std::vector<double> second = native::matmul(a, b).to_vector<double>();
    ASSERT_EQ(first.size(), second.size());
    for (size_t i = 0; i < first.size(); ++i) ASSERT_EQ(first[i], second[i]) << "at flat index " << i;
  }
}

TEST(CudaMatmul, Tf32SwitchSetsTheF32Precision) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  const Tensor a = random_tensor({256, 512}, DType::f32, false, -1.0, 1.0).to(kGpu);
  const Tensor b = random_tensor({512, 256}, DType::f32, false, -1.0, 1.0).to(kGpu);
  const RefTensor want = reference::matmul(reference::from_tensor(a), reference::from_tensor(b));
  auto max_error = [&] {
    const std::vector<double> got = native::matmul(a, b).to_vector<double>();
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want.data[i]));
    return worst;
  };
  {
    Tf32Scope off(false);
    EXPECT_FALSE(cuda::allow_tf32());
    EXPECT_TRUE(matmul_matches_reference(a, b, /*tf32=*/false));
    // Entries are about 7 in size; f32 accumulation over 512 terms stays far below 1e-4.
    EXPECT_LT(max_error(), 1e-4);
  }
  {
    Tf32Scope on(true);
    EXPECT_TRUE(cuda::allow_tf32());
    EXPECT_TRUE(matmul_matches_reference(a, b, /*tf32=*/true));
    // Inputs rounded to 10-bit mantissas leave errors around 3e-3 per entry: the switch took.
    EXPECT_GT(max_error(), 1e-4);
  }
  {
    // Switching back restores full f32 (the algorithm cache is keyed by compute type).
    Tf32Scope off(false);
    EXPECT_LT(max_error(), 1e-4);
  }
}

TEST(CudaMatmul, BadOperandsNameTheProblem) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Tensor a = empty({3, 4}, {DType::f32, kGpu});
  EXPECT_EMBER_ERROR(native::matmul(a, empty({4, 2}, {DType::f16, kGpu})), "matmul", "same dtype");
  EXPECT_EMBER_ERROR(native::matmul(a, empty({4, 2}, {DType::f32, Device::cpu()})), "matmul", "different devices");
  EXPECT_EMBER_ERROR(native::matmul(a, empty({5, 2}, {DType::f32, kGpu})), "matmul", "cannot be multiplied");
  EXPECT_EMBER_ERROR(native::bmm(empty({2, 3, 4}, {DType::f32, kGpu}), empty({3, 4, 2}, {DType::f32, kGpu})), "bmm",
                     "batch sizes");
  EXPECT_EMBER_ERROR(native::linear(a, empty({5, 4}, {DType::f32, kGpu}), empty({4}, {DType::f32, kGpu})), "linear",
                     "bias");
}
