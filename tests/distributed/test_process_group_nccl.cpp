// ProcessGroupNCCL on one GPU (world 1: NCCL refuses two ranks on one device): every collective
// runs end to end and bad input is refused. Skips without a GPU.
#include <thread>

#include "distributed/hash_store.h"
#include "distributed/process_group.h"
#include "test_util.h"
#if defined(EMBER_WITH_NCCL)
#include "distributed/nccl/process_group_nccl.h"
#include "kernels/cuda/cuda_runtime.h"
#endif

namespace ember::distributed {
namespace {

#if defined(EMBER_WITH_NCCL)

bool have_gpu() { return cuda::is_available(); }

std::shared_ptr<ProcessGroup> make_group() {
  auto store = std::make_shared<HashStore>(std::chrono::milliseconds(20000));
  ProcessGroupOptions opt;
  opt.timeout = std::chrono::milliseconds(20000);
  return new_process_group(store, 0, 1, "nccl", opt);
}

TEST(ProcessGroupNCCL, CollectivesOnOneGpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto pg = make_group();
  EXPECT_EQ(pg->backend_name(), "nccl");
  const Device gpu = Device::cuda(0);
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64}) {
    Tensor x = arange(0, 10, 1, {dt}).to(gpu);
    pg->allreduce(x, ReduceOp::Sum)->wait();
    EXPECT_EQ(x.to_vector<double>()[7], 7.0) << dtype_name(dt);
    pg->broadcast(x, 0)->wait();
    EXPECT_EQ(x.to_vector<double>()[9], 9.0) << dtype_name(dt);
  }
  Tensor f = full({4}, 6.0, {DType::f32, gpu});
  pg->allreduce(f, ReduceOp::Avg)->wait();
  EXPECT_EQ(f.to_vector<float>()[3], 6.0f);
  const auto parts = pg->allgather(full({3, 2}, 5.0, {DType::f32, gpu}));
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].shape(), (Shape{3, 2}));
  EXPECT_EQ(parts[0].to_vector<float>()[5], 5.0f);
  Tensor out = zeros({2, 2}, {DType::f32, gpu});
  pg->reduce_scatter(out, full({2, 2}, 3.0, {DType::f32, gpu}))->wait();
  EXPECT_EQ(out.to_vector<float>()[3], 3.0f);
  const auto blobs = pg->allgather_bytes(Bytes{1, 2, 3});
  ASSERT_EQ(blobs.size(), 1u);
  EXPECT_EQ(blobs[0], (Bytes{1, 2, 3}));
  pg->barrier();
}

TEST(ProcessGroupNCCL, RefusesCpuTensorsAndIntegerAvg) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto pg = make_group();
  EXPECT_EMBER_ERROR(pg->allreduce(zeros({3})), "allreduce (world 1, rank 0)", "CUDA tensors");
  EXPECT_EMBER_ERROR(pg->allreduce(zeros({3}, {DType::i32, Device::cuda(0)}), ReduceOp::Avg), "avg");
  EXPECT_EMBER_ERROR(pg->allreduce(zeros({4, 3}, {DType::f32, Device::cuda(0)}).t()), "contiguous");
}

TEST(ProcessGroupNCCL, WithoutAGpuConstructionSaysWhy) {
  if (have_gpu()) GTEST_SKIP() << "a GPU is present";
  EXPECT_EMBER_ERROR(make_group(), "ProcessGroupNCCL", "no CUDA device");
}

#else

TEST(ProcessGroupNCCL, NeedsACudaBuild) {
  auto store = std::make_shared<HashStore>(std::chrono::milliseconds(1000));
  EXPECT_EMBER_ERROR(new_process_group(store, 0, 1, "nccl"), "nccl", "CUDA");
}

#endif

}  // namespace
}  // namespace ember::distributed
