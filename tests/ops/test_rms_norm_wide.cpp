// The 16-lane (AVX-512) RMS norm row loops against the 8-lane (AVX2) ones
// (kernels/cpu/rms_norm_rows_avx512.h), each run forced through
// set_cpu_capability: rms_norm forward and backward (dx and dweight together,
// dx alone, dweight alone), with and without a weight, must give the same bits
// over row lengths that take the 16-lane loops (multiples of 16) and lengths
// that do not, with row counts that leave groups of one to three rows and more
// than one dweight chunk. Skips where the CPU has no AVX-512.
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

class RmsNormWide : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512 for the 16-lane RMS norm rows";
  }
};

TEST_F(RmsNormWide, ForwardAndBackwardMatchTheAvx2RowsBitForBit) {
  for (int64_t n : {16, 32, 48, 1024, 1040, 24, 100}) {
    for (int64_t rows : {1, 3, 70}) {  // 70: groups of four with two left over, three dweight chunks
      for (int what = 0; what < 6; ++what) {
        const bool with_w = what & 1;
        const int grads = what >> 1;  // 0: dx and dweight, 1: dx alone, 2: dweight alone
        if (!with_w && grads == 2) continue;
        const Tensor x = random_tensor({rows, n}, DType::f32, false, -3.0, 5.0);
        const Tensor g = random_tensor({rows, n}, DType::f32);
        const Tensor w = with_w ? random_tensor({n}, DType::f32, false, 0.5, 1.5) : Tensor();
        const std::string label = "n " + std::to_string(n) + " rows " + std::to_string(rows) + (with_w ? " w" : "") +
                                  " grads " + std::to_string(grads);
        expect_avx2_and_avx512_agree(label, [&] {
          const Tensor xl = grads == 2 ? x : x.detach().requires_grad_();
          const Tensor wl = with_w ? (grads == 1 ? w : w.detach().requires_grad_()) : Tensor();
          const Tensor y = rms_norm(xl, {n}, wl, 1e-5);
          y.backward(g);
          std::vector<Tensor> out{y.detach()};
          if (grads != 2) out.push_back(xl.grad());
          if (with_w && grads != 1) out.push_back(wl.grad());
          return out;
        });
      }
    }
  }
}

}  // namespace
