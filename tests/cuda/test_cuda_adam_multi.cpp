// The multi-tensor Adam/AdamW step on the GPU (kernels/cuda/fused_optim_multi.cu): a list of
// many parameters of random sizes (more than one launch's worth) updated by one
// native::adam_multi_step equals the per-tensor CUDA adam_step bit for bit and the CPU step
// within rounding, for f32 and f64 parameters with every gradient dtype, with and without
// weight decay and gradient scaling; also for a tensor larger than one launch and for tensors
// off the vector alignment. Skips without a CUDA device.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/device_api.h"
#include "core/native/fused_optim.h"
#include "adam_args.h"
#include "same_bits.h"
#include "test_util.h"

using namespace ember;
using ember::testing::all_close;
using ember::testing::same_bytes;
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

// One step of every entry by itself (single) and of all of them in one multi-tensor call.
void step_single_and_multi(std::vector<State>& single, std::vector<State>& multi, const std::vector<Tensor>& grads,
                           const native::AdamStepArgs& args) {
  std::vector<native::AdamTensors> list;
  for (size_t i = 0; i < single.size(); ++i) {
    native::adam_step(single[i].p, grads[i], single[i].m, single[i].v, args);
    list.push_back({multi[i].p, grads[i], multi[i].m, multi[i].v});
  }
  native::adam_multi_step(list, args);
}

void expect_same_states(const std::vector<State>& multi, const std::vector<State>& single,
                        const std::vector<int64_t>& sizes) {
  for (size_t i = 0; i < sizes.size(); ++i) {
    SCOPED_TRACE("entry " + std::to_string(i) + " of " + std::to_string(sizes[i]) + " elements");
    EXPECT_TRUE(same_bytes(multi[i].p, single[i].p)) << "param";
    EXPECT_TRUE(same_bytes(multi[i].m, single[i].m)) << "exp_avg";
    EXPECT_TRUE(same_bytes(multi[i].v, single[i].v)) << "exp_avg_sq";
  }
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
            EXPECT_TRUE(same_bytes(multi[i].p, single[i].p)) << "param";
            EXPECT_TRUE(same_bytes(multi[i].m, single[i].m)) << "exp_avg";
            EXPECT_TRUE(same_bytes(multi[i].v, single[i].v)) << "exp_avg_sq";
            EXPECT_TRUE(all_close(multi[i].p.to(Device::cpu()), cpu[i].p, tol, tol)) << "param vs CPU";
            EXPECT_TRUE(all_close(multi[i].v.to(Device::cpu()), cpu[i].v, tol, tol)) << "exp_avg_sq vs CPU";
          }
        }
      }
    }
  }
}

// One launch carries at most 320 chunks of 65536 elements (about 21 M elements); a parameter
// with more carries over into the next launch, its chunk numbers continuing there. A 21.2 M
// element tensor between two small ones crosses that boundary mid-tensor with its last chunk
// partial; every element must still be updated exactly as the per-tensor kernel does.
TEST(CudaAdamMultiTensor, ATensorLargerThanOneLaunchCarriesOver) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  const int64_t per_launch = int64_t(320) * 65536;
  const std::vector<int64_t> sizes = {1000, per_launch + 3 * 65536 + 5, 77};
  for (DType grad_dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(std::string(dtype_name(grad_dt)) + " grads");
    std::vector<State> single, multi;
    std::vector<Tensor> grads;
    for (int64_t n : sizes) {
      const State s{random_tensor({n}), random_tensor({n}, DType::f32, false, -0.5, 0.5),
                    random_tensor({n}, DType::f32, false, 0.0, 0.5)};
      single.push_back(s.on(kGpu));
      multi.push_back(s.on(kGpu));
      grads.push_back(random_tensor({n}, grad_dt, false, -1.0, 1.0).to(kGpu));
    }
    for (int step = 1; step <= 2; ++step) step_single_and_multi(single, multi, grads, make_args(true, 0.01, 1.0, step));
    expect_same_states(multi, single, sizes);
    // and the update really happened at the far end of the big tensor
    const int64_t last = sizes[1] - 1;
    EXPECT_NE(multi[1].m.narrow(0, last, 1).item_double(), 0.0);
  }
}

// Tensors that start one element past a vector boundary (views into larger buffers), alone or
// beside aligned ones, take the element-by-element path: the same bits as the per-tensor step.
TEST(CudaAdamMultiTensor, UnalignedTensorsMatchThePerTensorStep) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE("seed " + std::to_string(ember::testing::test_seed()));
  // An f32 view at element `offset` of a fresh buffer of n + 8 elements.
  const auto view = [](int64_t n, int64_t offset, double lo, double hi) {
    return random_tensor({n + 8}, DType::f32, false, lo, hi).to(kGpu).narrow(0, offset, n);
  };
  const std::vector<int64_t> sizes = {5, 4096, 65536 + 3, 200000};
  for (int64_t offset : {1, 2, 3}) {
    for (bool all_unaligned : {true, false}) {  // false: only the gradient is off the boundary
      SCOPED_TRACE("offset " + std::to_string(offset) + (all_unaligned ? ", every array" : ", the gradient"));
      const int64_t o = all_unaligned ? offset : 0;
      std::vector<State> single, multi;
      std::vector<Tensor> grads;
      for (int64_t n : sizes) {
        const State s{view(n, o, -1.0, 1.0), view(n, o, -0.5, 0.5), view(n, o, 0.0, 0.5)};
        single.push_back({s.p.clone(), s.m.clone(), s.v.clone()});
        multi.push_back(s);  // the views themselves, updated in place
        grads.push_back(view(n, offset, -1.0, 1.0));
      }
      ASSERT_NE(reinterpret_cast<uintptr_t>(grads[0].raw_data()) % 16, 0u);
      step_single_and_multi(single, multi, grads, make_args(true, 0.01, 1.0, 1));
      expect_same_states(multi, single, sizes);
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
