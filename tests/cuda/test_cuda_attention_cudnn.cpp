// Attention on cuDNN's fused flash-attention engines (kernels/cuda/fused_attention_cudnn.cu)
// against the CPU kernels run in f32 on the same (rounded) inputs: forward, the saved softmax
// statistics and the three gradients; f16 and bf16; causal and not; query and key lengths that
// differ; head dims 64 and 128; several batches and heads; the packed projection's strided
// operands; the public op with autograd. Problems cuDNN must not take (f32, dropout, a mask, a
// head dim it does not support) go to Ember's kernels, as does everything with the switch off;
// the counters show which path each call took. The cuDNN results repeat bit for bit. Every test
// skips without a CUDA device.
#include <cmath>
#include <string>
#include <vector>

#include "core/device_api.h"
#include "core/factory.h"
#include "core/native/fused.h"
#include "core/ops.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/cudnn_attention_plans.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_tensor;

namespace {

const Device kGpu = Device::cuda(0);
const DType kHalfTypes[] = {DType::f16, DType::bf16};

Tensor cpu(const Tensor& t) { return t.to(Device::cpu()); }
Tensor f32(const Tensor& t) { return cpu(t).to(DType::f32); }

// Turns cuDNN attention on or off for a scope, then back on: this file tests it on (it is off by
// default until a device run has confirmed it).
struct CudnnSwitch {
  explicit CudnnSwitch(bool on) { cuda::set_cudnn_attention(on); }
  ~CudnnSwitch() { cuda::set_cudnn_attention(true); }
};
const bool cudnn_attention_on = [] {
  cuda::set_cudnn_attention(true);
  return true;
}();

// Tolerances for half-precision results against the f32 CPU kernel on the same inputs.
double out_tol(DType dt) { return dt == DType::bf16 ? 3e-2 : 5e-3; }
double grad_tol(DType dt) { return dt == DType::bf16 ? 6e-2 : 1.5e-2; }

struct Case {
  int64_t b, heads, len_q, len_k, d;
  bool causal;
};

std::string label(DType dt, const Case& c) {
  return std::string(dtype_name(dt)) + " b " + std::to_string(c.b) + " h " + std::to_string(c.heads) + " L " +
         std::to_string(c.len_q) + " S " + std::to_string(c.len_k) + " d " + std::to_string(c.d) +
         (c.causal ? " causal" : "");
}

// Each stats row's logsumexp, max + log(sum) = max - log(1 / sum), whatever path wrote it.
Tensor logsumexp_of(const Tensor& stats) {
  const std::vector<float> s = f32(stats).to_vector<float>();
  std::vector<float> lse(s.size() / 2);
  for (size_t i = 0; i < lse.size(); ++i) lse[i] = s[2 * i] - std::log(s[2 * i + 1]);
  return from_vector(lse, {int64_t(lse.size())});
}

struct Inputs {
  Tensor q, k, v, g;  // CPU, in the case's dtype
};

Inputs inputs_for(DType dt, const Case& c) {
  Inputs in;
  in.q = random_tensor({c.b, c.heads, c.len_q, c.d}, dt, false, -1.5, 1.5);
  in.k = random_tensor({c.b, c.heads, c.len_k, c.d}, dt, false, -1.5, 1.5);
  in.v = random_tensor({c.b, c.heads, c.len_k, c.d}, dt, false, -1.5, 1.5);
  in.g = random_tensor({c.b, c.heads, c.len_q, c.d}, dt);
  return in;
}

struct Outcome {
  Tensor out, lse, dq, dk, dv;  // CPU
};

// native forward and backward on `device` (inputs of `dt` there); results on the CPU.
Outcome run(const Inputs& in, DType dt, Device device, bool causal, double scale) {
  auto at = [&](const Tensor& t) { return t.to(dt).to(device); };
  const native::AttentionResult r =
      native::scaled_dot_product_attention(at(in.q), at(in.k), at(in.v), Tensor(), causal, scale, 0.0);
  const native::AttentionGrads g = native::scaled_dot_product_attention_backward(at(in.g), r.saved, 1.0);
  return {cpu(r.out), logsumexp_of(r.saved.stats), cpu(g.dq), cpu(g.dk), cpu(g.dv)};
}

void expect_close(const Outcome& got, const Outcome& want, DType dt) {
  EXPECT_TRUE(all_close(got.out.to(DType::f32), want.out.to(DType::f32), out_tol(dt), out_tol(dt))) << "out";
  EXPECT_TRUE(all_close(got.lse, want.lse, 1e-2, 1e-3)) << "logsumexp";
  EXPECT_TRUE(all_close(got.dq.to(DType::f32), want.dq.to(DType::f32), grad_tol(dt), grad_tol(dt))) << "dq";
  EXPECT_TRUE(all_close(got.dk.to(DType::f32), want.dk.to(DType::f32), grad_tol(dt), grad_tol(dt))) << "dk";
  EXPECT_TRUE(all_close(got.dv.to(DType::f32), want.dv.to(DType::f32), grad_tol(dt), grad_tol(dt))) << "dv";
}

void expect_bitwise_equal(const Tensor& a, const Tensor& b, const char* what) {
  EXPECT_EQ(f32(a).to_vector<float>(), f32(b).to_vector<float>()) << what;
}

}  // namespace

TEST(CudaAttentionCudnn, MatchesTheCpuForwardStatsAndGradients) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  const std::vector<Case> cases = {{2, 3, 64, 64, 64, false},   {2, 3, 64, 64, 64, true},
                                   {1, 4, 100, 37, 64, true},   {3, 2, 37, 100, 128, true},
                                   {2, 2, 129, 129, 128, false}, {2, 2, 1, 50, 64, false},
                                   {1, 1, 200, 256, 64, true}};
  for (DType dt : kHalfTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(label(dt, c));
      const Inputs in = inputs_for(dt, c);
      const double scale = 1.0 / std::sqrt(double(c.d));
      const cuda::CudnnAttentionCounts before = cuda::cudnn_attention_counts();
      const Outcome got = run(in, dt, kGpu, c.causal, scale);
      const cuda::CudnnAttentionCounts after = cuda::cudnn_attention_counts();
      EXPECT_EQ(after.forward - before.forward, 1 + 1) << "the forward, and the backward's recomputation";
      EXPECT_EQ(after.backward - before.backward, 1);
      EXPECT_EQ(after.declined, before.declined);
      const Outcome want = run(in, DType::f32, Device::cpu(), c.causal, scale);
      expect_close(got, want, dt);
    }
  }
}

TEST(CudaAttentionCudnn, AnyScaleIsHonoured) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Case c{2, 2, 48, 80, 64, true};
  const Inputs in = inputs_for(DType::bf16, c);
  for (double scale : {0.05, 0.3}) {
    SCOPED_TRACE("scale " + std::to_string(scale));
    expect_close(run(in, DType::bf16, kGpu, c.causal, scale), run(in, DType::f32, Device::cpu(), c.causal, scale),
                 DType::bf16);
  }
}

TEST(CudaAttentionCudnn, EmberBackwardReadsTheCudnnStatistics) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  // forward on cuDNN, backward on Ember's bf16 kernel from the (logsumexp, 1) stats
  const Case c{2, 2, 70, 90, 64, true};
  const Inputs in = inputs_for(DType::bf16, c);
  const double scale = 0.125;
  auto at = [&](const Tensor& t) { return t.to(kGpu); };
  const native::AttentionResult r =
      native::scaled_dot_product_attention(at(in.q), at(in.k), at(in.v), Tensor(), true, scale, 0.0);
  native::AttentionGrads g;
  {
    CudnnSwitch off(false);
    g = native::scaled_dot_product_attention_backward(at(in.g), r.saved, 1.0);
  }
  const Outcome want = run(in, DType::f32, Device::cpu(), true, scale);
  expect_close({cpu(r.out), logsumexp_of(r.saved.stats), cpu(g.dq), cpu(g.dk), cpu(g.dv)}, want, DType::bf16);
}

TEST(CudaAttentionCudnn, PackedProjectionRunsOnCudnn) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  // q, k and v strided inside one [B, L, 3E] tensor, ctx [B, L, E]: heads 4 of dim 64
  const int64_t b = 2, len = 77, heads = 4, e = 256;
  const Tensor qkv = random_tensor({b, len, 3 * e}, DType::bf16, false, -1.5, 1.5);
  const Tensor grad = random_tensor({b, len, e}, DType::bf16);
  const double scale = 0.125;
  const cuda::CudnnAttentionCounts before = cuda::cudnn_attention_counts();
  const native::PackedAttentionResult r = native::packed_self_attention(qkv.to(kGpu), heads, Tensor(), scale, 0.0);
  const Tensor dqkv = native::packed_self_attention_backward(grad.to(kGpu), r.saved, 1.0);
  const cuda::CudnnAttentionCounts after = cuda::cudnn_attention_counts();
  EXPECT_EQ(after.forward - before.forward, 2);
  EXPECT_EQ(after.backward - before.backward, 1);
  const native::PackedAttentionResult want = native::packed_self_attention(qkv.to(DType::f32), heads, Tensor(), scale, 0.0);
  const Tensor want_d = native::packed_self_attention_backward(grad.to(DType::f32), want.saved, 1.0);
  EXPECT_TRUE(all_close(f32(r.ctx), want.ctx, out_tol(DType::bf16), out_tol(DType::bf16))) << "ctx";
  EXPECT_TRUE(all_close(f32(dqkv), want_d, grad_tol(DType::bf16), grad_tol(DType::bf16))) << "dqkv";
}

TEST(CudaAttentionCudnn, PublicOpTakesCudnnWithAutograd) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kHalfTypes) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (causal ? " causal" : " plain"));
      const Inputs in = inputs_for(dt, {2, 3, 50, 70, 64, causal});
      Tensor gq = in.q.to(kGpu).requires_grad_(), gk = in.k.to(kGpu).requires_grad_(),
             gv = in.v.to(kGpu).requires_grad_();
      Tensor cq = f32(in.q).requires_grad_(), ck = f32(in.k).requires_grad_(), cv = f32(in.v).requires_grad_();
      const cuda::CudnnAttentionCounts before = cuda::cudnn_attention_counts();
      const Tensor gy = scaled_dot_product_attention(gq, gk, gv, Tensor(), 0.0, causal);
      mul(gy, in.g.to(kGpu)).sum().backward();
      const cuda::CudnnAttentionCounts after = cuda::cudnn_attention_counts();
      EXPECT_EQ(after.forward - before.forward, 2);
      EXPECT_EQ(after.backward - before.backward, 1);
      EXPECT_EQ(gy.dtype(), dt);
      const Tensor cy = scaled_dot_product_attention(cq, ck, cv, Tensor(), 0.0, causal);
      mul(cy, f32(in.g)).sum().backward();
      EXPECT_TRUE(all_close(f32(gy), cy.detach(), out_tol(dt), out_tol(dt)));
      EXPECT_TRUE(all_close(f32(gq.grad()), cq.grad(), grad_tol(dt), grad_tol(dt))) << "dq";
      EXPECT_TRUE(all_close(f32(gk.grad()), ck.grad(), grad_tol(dt), grad_tol(dt))) << "dk";
      EXPECT_TRUE(all_close(f32(gv.grad()), cv.grad(), grad_tol(dt), grad_tol(dt))) << "dv";
    }
  }
}

TEST(CudaAttentionCudnn, DeclinesWhatItMustNotTake) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  struct Declined {
    const char* what;
    DType dt;
    int64_t d;
    bool masked;
    double p;
  };
  const std::vector<Declined> cases = {{"f32", DType::f32, 64, false, 0.0},
                                       {"dropout", DType::bf16, 64, false, 0.25},
                                       {"additive mask", DType::bf16, 64, true, 0.0},
                                       {"head dim not a multiple of 8", DType::bf16, 36, false, 0.0},
                                       {"head dim above the limit", DType::bf16, 256, false, 0.0},
                                       {"f16 head dim not a multiple of 8", DType::f16, 36, false, 0.0}};
  for (const Declined& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_FALSE(native::attention_library_takes(kGpu, c.dt, c.d, c.d, c.masked, c.p));
    const Tensor q = random_tensor({2, 2, 40, c.d}, c.dt, false, -1.5, 1.5);
    const Tensor k = random_tensor({2, 2, 30, c.d}, c.dt, false, -1.5, 1.5);
    const Tensor v = random_tensor({2, 2, 30, c.d}, c.dt, false, -1.5, 1.5);
    const Tensor mask = c.masked ? random_tensor({2, 1, 1, 30}, DType::f32, false, -3.0, 0.0) : Tensor();
    const Tensor g = random_tensor({2, 2, 40, c.d}, c.dt);
    const GeneratorState st{1234, 0};
    Generator cpu_gen(0), gpu_gen(0);
    cpu_gen.set_state(st);
    gpu_gen.set_state(st);
    const cuda::CudnnAttentionCounts before = cuda::cudnn_attention_counts();
    const native::AttentionResult r = native::scaled_dot_product_attention(
        q.to(kGpu), k.to(kGpu), v.to(kGpu), mask.defined() ? mask.to(kGpu) : Tensor(), false, 0.2, c.p, gpu_gen);
    const double drop_scale = c.p > 0 ? 1.0 / (1.0 - c.p) : 1.0;
    const native::AttentionGrads got = native::scaled_dot_product_attention_backward(g.to(kGpu), r.saved, drop_scale);
    const cuda::CudnnAttentionCounts after = cuda::cudnn_attention_counts();
    EXPECT_EQ(after.forward, before.forward);
    EXPECT_EQ(after.backward, before.backward);
    EXPECT_EQ(after.declined - before.declined, 2) << "forward and backward handed back";
    // Ember's kernels ran: the CPU's results (in f32 for the half types)
    const native::AttentionResult want = native::scaled_dot_product_attention(
        q.to(DType::f32), k.to(DType::f32), v.to(DType::f32), mask, false, 0.2, c.p, cpu_gen);
    const native::AttentionGrads want_g =
        native::scaled_dot_product_attention_backward(g.to(DType::f32), want.saved, drop_scale);
    const double tol = c.dt == DType::f32 ? 1e-4 : out_tol(c.dt);
    const double gtol = c.dt == DType::f32 ? 1e-4 : grad_tol(c.dt);
    EXPECT_TRUE(all_close(f32(r.out), want.out, tol, tol)) << "out";
    EXPECT_TRUE(all_close(f32(got.dq), want_g.dq, gtol, gtol)) << "dq";
    EXPECT_TRUE(all_close(f32(got.dk), want_g.dk, gtol, gtol)) << "dk";
    EXPECT_TRUE(all_close(f32(got.dv), want_g.dv, gtol, gtol)) << "dv";
  }
}

TEST(CudaAttentionCudnn, SwitchOffRunsEmberKernelsWithinTolerance) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Case c{2, 3, 90, 60, 64, true};
  for (DType dt : kHalfTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Inputs in = inputs_for(dt, c);
    const Outcome on = run(in, dt, kGpu, c.causal, 0.125);
    CudnnSwitch off(false);
    EXPECT_FALSE(native::attention_library_takes(kGpu, dt, 64, 64, false, 0.0));
    const cuda::CudnnAttentionCounts before = cuda::cudnn_attention_counts();
    const Outcome own = run(in, dt, kGpu, c.causal, 0.125);
    const cuda::CudnnAttentionCounts after = cuda::cudnn_attention_counts();
    EXPECT_EQ(after.forward, before.forward);
    EXPECT_EQ(after.backward, before.backward);
    expect_close(on, own, dt);
  }
}

TEST(CudaAttentionCudnn, RepeatsBitForBitAndCachesOnePlanPerShape) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Case c{2, 4, 128, 96, 128, true};
  const Inputs in = inputs_for(DType::bf16, c);
  const Outcome first = run(in, DType::bf16, kGpu, c.causal, 0.1);
  const size_t plans = cuda::cudnn_attention_plan_count();
  const Outcome second = run(in, DType::bf16, kGpu, c.causal, 0.1);
  EXPECT_EQ(cuda::cudnn_attention_plan_count(), plans) << "the same shape reuses its plans";
  expect_bitwise_equal(first.out, second.out, "out");
  expect_bitwise_equal(first.lse, second.lse, "logsumexp");
  expect_bitwise_equal(first.dq, second.dq, "dq");
  expect_bitwise_equal(first.dk, second.dk, "dk");
  expect_bitwise_equal(first.dv, second.dv, "dv");
}
