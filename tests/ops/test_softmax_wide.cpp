// The 16-lane (AVX-512) softmax rows against the 8-lane (AVX2) ones (kernels/cpu/softmax_avx512.h),
// each run forced through set_cpu_capability: softmax, log_softmax, scaled_masked_softmax and attention,
// forward and backward, must give the same bits over row lengths that reach every lane body and
// tail and cross the 512-element flush of the row sums, in every row grouping, with masks, -inf
// rows, NaN, +-inf, huge and tiny values. A NaN matches any NaN (same_bits): its sign follows
// the operand order the compiler picks for each commutative add or multiply, which neither width
// pins down. Skips where the CPU has no AVX-512.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/cpu/softmax_rows.h"
#include "capability_paths.h"
#include "test_util.h"

using namespace ember;
using ember::testing::random_tensor;
using ember::testing::cpu_has_avx512;
using ember::testing::expect_avx2_and_avx512_agree;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Lengths with every remainder mod 16, a few whole 16s, and rows past one and two flush blocks.
std::vector<int64_t> row_lengths() {
  std::vector<int64_t> lens;
  for (int64_t n = 1; n <= 34; ++n) lens.push_back(n);
  for (int64_t n : {47, 100, 128, 129, 515, 1031}) lens.push_back(n);
  return lens;
}

// 7 rows of n (the plain softmax takes them in threes, the attention rows in pairs, each with one
// left over; the fused softmax below takes 3 x 7 in fours): plain values, values spread so most
// exps underflow, tiny values, a row all -inf (a NaN row), one finite value among -inf, a row of
// specials, and values with one NaN.
Tensor scores(int64_t n) {
  std::vector<float> v = random_tensor({7, n}, DType::f32, false, -8.0, 8.0).to_vector<float>();
  const std::vector<float> spread = random_tensor({n}, DType::f32, false, -400.0, 400.0).to_vector<float>();
  const std::vector<float> tiny = random_tensor({n}, DType::f32, false, -1e-3, 1e-3).to_vector<float>();
  const std::vector<float> specials = {-kInf, NAN,   kInf,   1e30f, -1e30f,  0.0f,
                                       -0.0f, 1e-40f, -1e-40f, 88.5f, -100.0f, 3.4e38f};
  auto at = [&](int64_t r, int64_t j) -> float& { return v[size_t(r * n + j)]; };
  for (int64_t j = 0; j < n; ++j) {
    at(1, j) = spread[size_t(j)];
    at(2, j) = tiny[size_t(j)];
    at(3, j) = -kInf;
    at(4, j) = j == n / 2 ? 1.5f : -kInf;
    if (j % 3 == 1) at(5, j) = specials[size_t(j / 3) % specials.size()];
  }
  at(6, (n * 5) / 7) = NAN;
  return from_vector(v, {7, n});
}

Tensor grad_of(const std::function<Tensor(const Tensor&)>& f, const Tensor& x, const Tensor& g) {
  Tensor xg = x.detach().requires_grad_();
  f(xg).backward(g);
  return xg.grad();
}

class SoftmaxWide : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512 for the 16-lane softmax rows";
  }
};

TEST_F(SoftmaxWide, SoftmaxMatchesTheAvx2RowsBitForBit) {
  for (int64_t n : row_lengths()) {
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      const Tensor x = scores(n).to(dt), g = random_tensor({7, n}, dt);
      // along the last dim (rows in threes, then alone) and along the first (columns, one at a time)
      expect_avx2_and_avx512_agree("softmax n " + std::to_string(n) + " " + dtype_name(dt), [&] {
        auto last = [](const Tensor& t) { return softmax(t, -1); };
        auto first = [](const Tensor& t) { return softmax(t, 0); };
        const Tensor xt = x.t().contiguous(), gt = g.t().contiguous();
        return std::vector<Tensor>{last(x), grad_of(last, x, g), first(xt), grad_of(first, xt, gt)};
      });
    }
  }
}

TEST_F(SoftmaxWide, LogSoftmaxMatchesTheAvx2RowsBitForBit) {
  for (int64_t n : row_lengths()) {
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      const Tensor x = scores(n).to(dt), g = random_tensor({7, n}, dt);
      // gradients with a NaN and +-inf among them, which the backward's row sum carries
      Tensor g_specials = g.clone();
      g_specials.narrow(0, 5, 1).narrow(1, n / 2, 1).fill_(NAN);
      g_specials.narrow(0, 2, 1).narrow(1, n - 1, 1).fill_(kInf);
      expect_avx2_and_avx512_agree("log_softmax n " + std::to_string(n) + " " + dtype_name(dt), [&] {
        auto last = [](const Tensor& t) { return log_softmax(t, -1); };
        auto first = [](const Tensor& t) { return log_softmax(t, 0); };
        const Tensor xt = x.t().contiguous(), gt = g.t().contiguous();
        return std::vector<Tensor>{last(x), grad_of(last, x, g), grad_of(last, x, g_specials), first(xt),
                                   grad_of(first, xt, gt)};
      });
    }
  }
}

TEST_F(SoftmaxWide, ScaledMaskedSoftmaxMatchesTheAvx2RowsBitForBit) {
  for (int64_t n : row_lengths()) {
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      const Tensor x = scores(n).to(dt).reshape({1, 7, 1, n}).expand({3, 7, 1, n}).contiguous();
      const Tensor g = random_tensor({3, 7, 1, n}, dt);
      // no mask, a padding mask broadcast over the rows, a mask per batch (rows of -inf, one
      // finite value, specials) over the 7 heads, a bf16 mask
      Tensor padding = zeros({1, 1, 1, n});
      padding.narrow(3, (2 * n) / 3, n - (2 * n) / 3).fill_(-1e4);
      const std::vector<Tensor> masks = {Tensor(), padding, scores(n).narrow(0, 3, 3).reshape({3, 1, 1, n}),
                                         random_tensor({1, 1, 1, n}, DType::bf16, false, -30.0, 0.0)};
      for (size_t k = 0; k < masks.size(); ++k) {
        expect_avx2_and_avx512_agree("scaled_masked_softmax n " + std::to_string(n) + " " + dtype_name(dt) + " mask " +
                               std::to_string(k),
                           [&] {
                             auto f = [&](const Tensor& t) { return scaled_masked_softmax(t, masks[k], 0.3); };
                             return std::vector<Tensor>{f(x), grad_of(f, x, g)};
                           });
      }
    }
  }
}

TEST_F(SoftmaxWide, AttentionMatchesTheAvx2RowsBitForBit) {
  // the attention kernels' rows go in pairs, or one at a time where causal
  for (int64_t len : {1, 9, 16, 33, 70}) {
    for (bool causal : {false, true}) {
      const Tensor q = random_tensor({2, 3, len, 8}), k = random_tensor({2, 3, len, 8}, DType::f32, false, -4, 4),
                   v = random_tensor({2, 3, len, 8}), g = random_tensor({2, 3, len, 8});
      // a mask of plain values for the first batch, of specials for the second
      const Tensor s = scores(len);
      const Tensor mask = causal ? Tensor() : cat({s.narrow(0, 0, 1), s.narrow(0, 5, 1)}, 0).reshape({2, 1, 1, len});
      expect_avx2_and_avx512_agree("attention len " + std::to_string(len) + (causal ? " causal" : " masked"), [&] {
        Tensor qg = q.detach().requires_grad_(), kg = k.detach().requires_grad_(), vg = v.detach().requires_grad_();
        Tensor out = scaled_dot_product_attention(qg, kg, vg, mask, 0.0, causal);
        out.backward(g);
        return std::vector<Tensor>{out.detach(), qg.grad(), kg.grad(), vg.grad()};
      });
    }
  }
}

}  // namespace
