// The 16-lane (AVX-512) layer norm row loops against the 8-lane (AVX2) ones
// (kernels/cpu/layer_norm_rows_avx512.h), each run forced through set_cpu_capability:
// layer_norm and add_layer_norm, forward and backward (dx, dresidual, dweight, dbias), with and
// without weight and bias, must give the same bits over row lengths that take the 16-lane loops
// (multiples of 16, past one and two 512-element flushes of the row sums) and lengths that do
// not, in f32 and bf16. Skips where the CPU has no AVX-512.
#include <functional>
#include <string>
#include <vector>

#include "capability_paths.h"
#include "test_util.h"

using namespace ember;
using ember::testing::cpu_has_avx512;
using ember::testing::expect_avx2_and_avx512_agree;
using ember::testing::random_tensor;

namespace {

// The forward result and every gradient of f(x, residual, w, b) against g.
std::vector<Tensor> forward_and_grads(
    const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&)>& f, const Tensor& x,
    const Tensor& residual, const Tensor& w, const Tensor& b, const Tensor& g) {
  auto leaf = [](const Tensor& t) { return t.defined() ? t.detach().requires_grad_() : Tensor(); };
  const Tensor xl = leaf(x), rl = leaf(residual), wl = leaf(w), bl = leaf(b);
  const Tensor y = f(xl, rl, wl, bl);
  y.backward(g);
  std::vector<Tensor> out{y.detach(), xl.grad()};
  for (const Tensor& t : {rl, wl, bl})
    if (t.defined()) out.push_back(t.grad());
  return out;
}

class LayerNormWide : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512 for the 16-lane layer norm rows";
  }
};

TEST_F(LayerNormWide, LayerNormAndAddLayerNormMatchTheAvx2RowsBitForBit) {
  for (int64_t n : {16, 32, 48, 256, 768, 1040, 24, 100}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      for (int params = 0; params < 4; ++params) {
        const bool with_w = params & 1, with_b = params & 2;
        // 37 rows: groups of four with one left over, and more than one backward chunk of 32
        const Tensor x = random_tensor({37, n}, dt, false, -3.0, 5.0), residual = random_tensor({37, n}, dt);
        const Tensor g = random_tensor({37, n}, dt);
        const Tensor w = with_w ? random_tensor({n}, DType::f32, false, 0.5, 1.5) : Tensor();
        const Tensor b = with_b ? random_tensor({n}, DType::f32) : Tensor();
        const std::string what = "n " + std::to_string(n) + " " + dtype_name(dt) + (with_w ? " w" : "") +
                                 (with_b ? " b" : "");
        expect_avx2_and_avx512_agree("layer_norm " + what, [&] {
          return forward_and_grads(
              [n](const Tensor& xv, const Tensor&, const Tensor& wv, const Tensor& bv) {
                return layer_norm(xv, {n}, wv, bv);
              },
              x, Tensor(), w, b, g);
        });
        expect_avx2_and_avx512_agree("add_layer_norm " + what, [&] {
          return forward_and_grads(
              [n](const Tensor& xv, const Tensor& rv, const Tensor& wv, const Tensor& bv) {
                return add_layer_norm(xv, rv, {n}, wv, bv);
              },
              x, residual, w, b, g);
        });
      }
    }
  }
}

}  // namespace
