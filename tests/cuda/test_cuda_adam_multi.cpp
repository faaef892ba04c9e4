// The multi-tensor Adam/AdamW step on the GPU (kernels/cuda/fused_optim_multi.cu): a list of
// many parameters of random sizes (more than one launch's worth) updated by one
// native::adam_multi_step equals the per-tensor CUDA adam_step bit for bit and the CPU step
// within rounding, for f32 and f64 parameters with every gradient dtype, with and without
// weight decay and gradient scaling. Skips without a CUDA device.
#include <cmath>
#include <string>
#include <vector>

#include "core/device_api.h"
#include "core/native/fused_optim.h"
#include "adam_args.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::random_tensor;
using ember::testing::uniform_int;

namespace {

const Device kGpu = Device::cuda(0);

native::AdamStepArgs make_args(bool decoupled, double weight_decay, double grad_scale, int step) {
  return ember::testing::adam_test_args(decoupled, weight_decay, grad_scale, step);
}

struct State {
  Tensor p, m, v;
  State on(Device d) const { return {p.to(d).clone(), m.to(d).clone(), v.to(d).clone()}; }
};

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ac = a.to(Device::cpu()).contiguous(), bc = b.to(Device::cpu()).contiguous();
  if (ac.dtype() != bc.dtype() || ac.shape() != bc.shape()) return false;
  const auto* pa = static_cast<const unsigned char*>(ac.raw_data());
  const auto* pb = static_cast<const unsigned char*>(bc.raw_data());
  for (size_t i = 0; i < size_t(ac.numel()) * ac.element_size(); ++i)
    if (pa[i] != pb[i]) return false;
  return true;
}

TEST(CudaAdamMultiTensor, MatchesPerTensorCudaBitForBitAndTheCpuWithinRounding) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  // 100 parameters, sizes 1 .. 70000, plus a few odd and vector-width edge sizes.
  std::vector<int64_t> sizes = {1, 3, 4, 5, 8, 127, 128, 129, 4096, 65537};
  while (sizes.size() < 100) sizes.push_back(uniform_int(1, 70000));
  for (DType param_dt : {DType::f32, DType::f64}) {
    for (DType grad_dt : ember::testing::kFloatTypes) {
      for (bool decoupled : {true, false}) {
        for (double wd : {0.0, 0.05}) {
          const double grad_scale = wd > 0 ? 0.5 : 1.0;
          SCOPED_TRACE(std::string(dtype_name(param_dt)) + " params, " + dtype_name(grad_dt) + " grads, " +
                       (decoupled ? "AdamW" : "Adam") + ", weight_decay " + std::to_string(wd));
          std::vector<State> cpu, single, multi;
          for (int64_t n : sizes) {
            const State s{random_tensor({n}, param_dt), random_tensor({n}, param_dt, false, -0.5, 0.5),
                          random_tensor({n}, param_dt, false, 0.0, 0.5)};
            cpu.push_back(s.on(Device::cpu()));
            single.push_back(s.on(kGpu));
            multi.push_back(s.on(kGpu));
          }
          for (int step = 1; step <= 3; ++step) {
            const native::AdamStepArgs args = make_args(decoupled, wd, grad_scale, step);
            std::vector<native::AdamTensors> list;
            for (size_t i = 0; i < sizes.size(); ++i) {
              const Tensor g = random_tensor({sizes[i]}, grad_dt, false, -1.0, 1.0);
              const Tensor gg = g.to(kGpu);
              native::adam_step(cpu[i].p, g, cpu[i].m, cpu[i].v, args);
              native::adam_step(single[i].p, gg, single[i].m, single[i].v, args);
              list.push_back({multi[i].p, gg, multi[i].m, multi[i].v});
            }
            native::adam_multi_step(list, args);
          }
          const double tol = param_dt == DType::f64 ? 1e-12 : 1e-5;
          for (size_t i = 0; i < sizes.size(); ++i) {
            SCOPED_TRACE("entry " + std::to_string(i) + " of " + std::to_string(sizes[i]) + " elements");
            EXPECT_TRUE(same_bits(multi[i].p, single[i].p)) << "param";
            EXPECT_TRUE(same_bits(multi[i].m, single[i].m)) << "exp_avg";
            EXPECT_TRUE(same_bits(multi[i].v, single[i].v)) << "exp_avg_sq";
            EXPECT_TRUE(all_close(multi[i].p.to(Device::cpu()), cpu[i].p, tol, tol)) << "param vs CPU";
            EXPECT_TRUE(all_close(multi[i].v.to(Device::cpu()), cpu[i].v, tol, tol)) << "exp_avg_sq vs CPU";
          }
        }
      }
    }
  }
}

TEST(CudaAdamMultiTensor, MixedDevicesInOneListAreRefused) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const Tensor p = random_tensor({4}), g = random_tensor({4});
  const Tensor pg = p.to(kGpu), gg = g.to(kGpu);
  std::vector<native::AdamTensors> list = {{pg, gg, pg.clone(), pg.clone()}, {p, g, p.clone(), p.clone()}};
  EXPECT_THROW(native::adam_multi_step(list, make_args(true, 0.0, 1.0, 1)), Error);
}

}  // namespace
