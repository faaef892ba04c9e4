// scaled_dot_product_attention on CUDA against the CPU: the fused kernel (native::attention_stub
// and its backward, through native::scaled_dot_product_attention) for causal and plain attention,
// query and key lengths that differ and span several tiles, broadcast batch dims, additive masks
// and dropout (its keep mask bit for bit the CPU's), in f32, bf16 and f64; and the public op,
// which runs the composition on a GPU unless EMBER_CUDA_ATTENTION=fused. Every test skips without
// a CUDA device.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/device_api.h"
#include "core/native/fused.h"
#include "kernels/cuda/cudnn_attention.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_tensor;
using ember::testing::tolerance;
using ember::testing::uniform_int;

namespace {

// These suites test Ember's own attention kernels (their stats layout included): the cuDNN path,
// tested in test_cuda_attention_cudnn.cpp, stays off in this binary.
class EmberAttentionKernelsOnly : public ::testing::Environment {
 public:
  void SetUp() override { ember::cuda::set_cudnn_attention(false); }
};
[[maybe_unused]] ::testing::Environment* const kEmberKernelsOnly =
    ::testing::AddGlobalTestEnvironment(new EmberAttentionKernelsOnly);

const Device kGpu = Device::cuda(0);

struct Case {
  int64_t len_q, len_k, d;
  bool causal, masked;
  double p;
};

std::string label(DType dt, const Case& c) {
  return std::string(dtype_name(dt)) + " L " + std::to_string(c.len_q) + " S " + std::to_string(c.len_k) + " d " +
         std::to_string(c.d) + (c.causal ? " causal" : "") + (c.masked ? " mask" : "") + " p " + std::to_string(c.p);
}

}  // namespace

TEST(CudaScaledDotProductAttention, FusedKernelMatchesTheCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  const std::vector<Case> cases = {{1, 1, 16, false, false, 0.0},  {7, 130, 32, false, true, 0.2},
                                   {130, 7, 64, true, false, 0.0}, {150, 150, 40, true, false, 0.2},
                                   {200, 90, 72, true, false, 0.0}, {64, 129, 128, false, true, 0.0}};
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(label(dt, c));
      const int64_t b = 2, heads = uniform_int(1, 3);
      const Tensor q = random_tensor({b, heads, c.len_q, c.d}, dt, false, -1.5, 1.5);
      const Tensor k = random_tensor({1, heads, c.len_k, c.d}, dt, false, -1.5, 1.5);  // broadcast over the batch
      const Tensor v = random_tensor({b, heads, c.len_k, c.d}, dt, false, -1.5, 1.5);
      const Tensor mask = c.masked ? random_tensor({b, 1, 1, c.len_k}, DType::f32, false, -4.0, 0.0) : Tensor();
      const double scale = 1.0 / std::sqrt(double(c.d));
      const GeneratorState st{uint64_t(uniform_int(0, 1 << 30)), uint64_t(uniform_int(0, 1000))};
      Generator cpu_gen(0), gpu_gen(0);
      cpu_gen.set_state(st);
      gpu_gen.set_state(st);
      const native::AttentionResult cpu = native::scaled_dot_product_attention(q, k, v, mask, c.causal, scale, c.p,
                                                                               cpu_gen);
      const native::AttentionResult gpu = native::scaled_dot_product_attention(
          q.to(kGpu), k.to(kGpu), v.to(kGpu), mask.defined() ? mask.to(kGpu) : Tensor(), c.causal, scale, c.p,
          gpu_gen);
      if (c.p > 0) {
        EXPECT_EQ(gpu.saved.keep.to(Device::cpu()).to(DType::f32).to_vector<float>(),
                  cpu.saved.keep.to(DType::f32).to_vector<float>());
      }
      const double tol = dt == DType::bf16 ? 3 * tolerance(dt) : 20 * tolerance(dt);
      EXPECT_TRUE(all_close(gpu.out, cpu.out, tol, tol)) << "out";
      const double stol = dt == DType::f64 ? 1e-9 : 1e-4;
      EXPECT_TRUE(all_close(gpu.saved.stats, cpu.saved.stats, stol, stol)) << "stats";

      const Tensor g = random_tensor(cpu.out.shape(), dt);
      const double drop_scale = c.p > 0 ? 1.0 / (1.0 - c.p) : 1.0;
      const native::AttentionGrads want = native::scaled_dot_product_attention_backward(g, cpu.saved, drop_scale);
      const native::AttentionGrads got =
          native::scaled_dot_product_attention_backward(g.to(kGpu), gpu.saved, drop_scale);
      const double gtol = dt == DType::bf16 ? 6 * tolerance(dt) : 50 * tolerance(dt);
      EXPECT_TRUE(all_close(got.dq, want.dq, gtol, gtol)) << "dq";
      EXPECT_TRUE(all_close(got.dk, want.dk, gtol, gtol)) << "dk";
      EXPECT_TRUE(all_close(got.dv, want.dv, gtol, gtol)) << "dv";
    }
  }
}

TEST(CudaScaledDotProductAttention, PublicOpMatchesTheCpu) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Tensor q = random_tensor({2, 3, 33, 16}), k = random_tensor({2, 3, 40, 16}), v = random_tensor({2, 3, 40, 8});
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "plain");
    Tensor gq = q.to(kGpu).requires_grad_(), gk = k.to(kGpu).requires_grad_(), gv = v.to(kGpu).requires_grad_();
    Tensor cq = q.detach().requires_grad_(), ck = k.detach().requires_grad_(), cv = v.detach().requires_grad_();
    const Tensor gy = scaled_dot_product_attention(gq, gk, gv, Tensor(), 0.0, causal);
    const Tensor cy = scaled_dot_product_attention(cq, ck, cv, Tensor(), 0.0, causal);
    EXPECT_TRUE(all_close(gy, cy, 1e-4, 1e-5));
    gy.sum().backward();
    cy.sum().backward();
    EXPECT_TRUE(all_close(gq.grad(), cq.grad(), 1e-4, 1e-5));
    EXPECT_TRUE(all_close(gk.grad(), ck.grad(), 1e-4, 1e-5));
    EXPECT_TRUE(all_close(gv.grad(), cv.grad(), 1e-4, 1e-5));
  }
}

TEST(CudaScaledDotProductAttention, DifferentValueDimIsRejectedByTheKernel) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Tensor q = zeros({1, 3, 8}, {DType::f32, kGpu}), v = zeros({1, 3, 4}, {DType::f32, kGpu});
  EXPECT_EMBER_ERROR(native::scaled_dot_product_attention(q, q, v, Tensor(), false, 0.5, 0.0), "attention",
                     "one head dim", "8", "4");
}
