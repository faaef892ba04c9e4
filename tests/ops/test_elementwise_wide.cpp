// The 16-lane (AVX-512) GELU rows and the fused AVX-512 dropout against the AVX2 paths, each run
// forced through set_cpu_capability, on one thread and on two: the same bits everywhere. Lengths
// below and above the streamed-output size (kernels/cpu/streamed_output.h), odd so the second
// thread's half starts inside a 64-byte line; NaN, +-inf, huge, tiny and far-tail values among
// the inputs; dropout counters whose low word carries inside a 16-block step. Skips where the
// CPU has no AVX-512.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/cpu/streamed_output.h"
#include "capability_paths.h"
#include "test_util.h"

using namespace ember;
using ember::testing::random_tensor;
using ember::testing::cpu_has_avx512;
using ember::testing::expect_avx2_and_avx512_agree;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// One length that stays in cache and one streamed (just over the size, by an odd count).
std::vector<int64_t> lengths() {
  const int64_t streamed = cpu::kStreamedOutputMinBytes / int64_t(sizeof(float)) + 37;
  return {4099, streamed};
}

// n values in [-12, 12] with specials at scattered places.
Tensor inputs(int64_t n) {
  Tensor x = random_tensor({n}, DType::f32, false, -12.0, 12.0);
  const std::vector<float> specials = {NAN, kInf, -kInf, 1e30f, -1e30f, 0.0f, -0.0f, 1e-40f, -13.5f, 3.4e38f};
  for (size_t k = 0; k < specials.size(); ++k) x.narrow(0, (int64_t(k) * 7919 + 5) % n, 1).fill_(specials[k]);
  return x;
}

// fn's result the same bits under every capability, on one thread and on two.
void expect_paths_agree(const std::string& what, const std::function<Tensor()>& fn) {
  expect_avx2_and_avx512_agree(what, [&] { return std::vector<Tensor>{fn()}; });
}

class ElementwiseWide : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512 for the 16-lane gelu rows and dropout";
  }
};

TEST_F(ElementwiseWide, GeluMatchesTheAvx2RowsBitForBit) {
  for (int64_t n : lengths()) {
    const Tensor x = inputs(n), g = random_tensor({n});
    for (bool tanh_approx : {false, true}) {
      expect_paths_agree("gelu n " + std::to_string(n) + (tanh_approx ? " tanh" : " erf"), [&] {
        Tensor xg = x.detach().requires_grad_();
        Tensor y = gelu(xg, tanh_approx);
        y.backward(g);
        return cat({y.detach(), xg.grad()});
      });
    }
  }
}

TEST_F(ElementwiseWide, DropoutMatchesTheAvx2PathBitForBit) {
  // the mask reaches the gradient: dx = dy * (keep ? scale : 0)
  for (int64_t n : lengths()) {
    const Tensor x = inputs(n), g = random_tensor({n});
    for (uint64_t offset : {uint64_t(0), (uint64_t(1) << 32) - 1003}) {
      expect_paths_agree("dropout n " + std::to_string(n) + " offset " + std::to_string(offset), [&] {
        default_generator().set_state({0x5EED, offset});
        Tensor xg = x.detach().requires_grad_();
        Tensor y = dropout(xg, 0.3, true);
        y.backward(g);
        return cat({y.detach(), xg.grad()});
      });
    }
  }
}

}  // namespace
