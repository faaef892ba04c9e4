// ProcessGroupNCCL on one GPU (world 1: NCCL refuses two ranks on one device): every collective
// runs end to end, on empty tensors too; bad input is refused; a collective that cannot finish
// times out and breaks the group, and a rank that never joins times out the setup. Skips
// without a GPU.
#include <atomic>
#include <chrono>
#include <thread>

#include "distributed/hash_store.h"
#include "distributed/process_group.h"
#include "test_util.h"
#if defined(EMBER_WITH_NCCL)
#include <cuda_runtime_api.h>

#include "distributed/nccl/process_group_nccl.h"
#include "kernels/cuda/cuda_runtime.h"
#include "kernels/cuda/cuda_stream.h"
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

// Empty tensors go through every collective (NCCL moves nothing; there is no memory to mark
// for the group's stream) and leave the group usable.
TEST(ProcessGroupNCCL, CollectivesOnEmptyTensors) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto pg = make_group();
  const Device gpu = Device::cuda(0);
  for (DType dt : {DType::f32, DType::bf16, DType::i64}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor e = empty({0}, {dt, gpu});
    pg->allreduce(e, ReduceOp::Sum)->wait();
    pg->allreduce(empty({0, 5}, {dt, gpu}), ReduceOp::Max)->wait();
    pg->broadcast(e, 0)->wait();
    pg->reduce_scatter(empty({0}, {dt, gpu}), empty({0}, {dt, gpu}))->wait();
    const auto parts = pg->allgather(empty({0, 3}, {dt, gpu}));
    ASSERT_EQ(parts.size(), 1u);
    EXPECT_EQ(parts[0].shape(), (Shape{0, 3}));
    EXPECT_TRUE(parts[0].is_cuda());
  }
  const auto blobs = pg->allgather_bytes(Bytes{});
  ASSERT_EQ(blobs.size(), 1u);
  EXPECT_TRUE(blobs[0].empty());
  // the group still works
  Tensor x = full({4}, 3.0, {DType::f32, gpu});
  pg->allreduce(x)->wait();
  EXPECT_EQ(x.to_vector<float>()[3], 3.0f);
  pg->barrier();
}

// allgather_into on one rank: the output is the input, in place too, on empty tensors, and a
// wrong output size is refused before anything is queued.
TEST(ProcessGroupNCCL, AllgatherIntoOnOneGpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto pg = make_group();
  const Device gpu = Device::cuda(0);
  for (DType dt : {DType::f32, DType::bf16, DType::i64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor in = arange(0, 6, 1, {dt}).view({2, 3}).to(gpu);
    Tensor out = zeros({6}, {dt, gpu});
    pg->allgather_into(out, in)->wait();
    EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{0, 1, 2, 3, 4, 5}));
    pg->allgather_into(out, out)->wait();  // the input is this rank's chunk: in place
    EXPECT_EQ(out.to_vector<double>()[5], 5.0);
    Tensor none = empty({0}, {dt, gpu});
    pg->allgather_into(none, empty({0, 3}, {dt, gpu}))->wait();
  }
  EXPECT_EMBER_ERROR(pg->allgather_into(zeros({5}, {DType::f32, gpu}), zeros({6}, {DType::f32, gpu})),
                     "allgather_into (world 1, rank 0)", "output has 5 elements");
  EXPECT_EMBER_ERROR(pg->allgather_into(zeros({6}), zeros({6})), "allgather_into", "CUDA tensors");
  Tensor x = full({4}, 3.0, {DType::f32, gpu});
  pg->allreduce(x)->wait();
  EXPECT_EQ(x.to_vector<float>()[3], 3.0f);
}

// Blocks `stream` (work queued after the hold waits) until release(); a deadline keeps a
// failing test from holding it forever.
class StreamHold {
 public:
  explicit StreamHold(cudaStream_t stream) {
    EXPECT_EQ(cudaLaunchHostFunc(stream, &StreamHold::wait_for_release, &released_), cudaSuccess);
  }
  void release() { released_.store(true); }

 private:
  static void CUDART_CB wait_for_release(void* flag) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    auto* released = static_cast<std::atomic<bool>*>(flag);
    while (!released->load() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  }
  std::atomic<bool> released_{false};
};

// A collective that cannot finish (it is queued behind work on the caller's stream that does
// not end) makes wait() raise past the group's timeout, naming the operation, the world and
// the rank; the communicator is aborted and the group refuses further collectives.
TEST(ProcessGroupNCCL, ACollectiveThatDoesNotFinishTimesOutAndBreaksTheGroup) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto store = std::make_shared<HashStore>(std::chrono::milliseconds(20000));
  ProcessGroupOptions opt;
  opt.timeout = std::chrono::milliseconds(400);
  auto pg = new_process_group(store, 0, 1, "nccl", opt);
  Tensor x = full({256}, 1.0, {DType::f32, Device::cuda(0)});
  cuda::Stream caller(Device::cuda(0));
  StreamHold hold(caller.handle());
  // Lets the stream go in any case, should the abort wait for it.
  std::atomic<bool> done{false};
  std::thread releaser([&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done.load() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    hold.release();
  });
  {
    cuda::StreamGuard on(caller);
    auto work = pg->allreduce(x);  // in place, Sum: on one rank NCCL queues nothing of its own
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EMBER_ERROR(work->wait(), "allreduce (world 1, rank 0)", "did not complete within 400ms",
                       "the communicator was aborted");
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(400));
    EXPECT_FALSE(work->is_completed());
  }
  EXPECT_EMBER_ERROR(pg->allreduce(x), "allreduce (world 1, rank 0)", "unusable after an earlier failure",
                     "did not complete");
  EXPECT_EMBER_ERROR(pg->barrier(), "unusable after an earlier failure");
  done.store(true);
  releaser.join();
  caller.synchronize();
  pg.reset();  // the destructor of a broken group returns at once
  EXPECT_EQ(x.to_vector<float>()[0], 1.0f);
}

// A rank that never joins: construction gives up after the timeout and names it.
TEST(ProcessGroupNCCL, AMissingRankTimesOutTheSetup) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto store = std::make_shared<HashStore>(std::chrono::milliseconds(20000));
  ProcessGroupOptions opt;
  opt.timeout = std::chrono::milliseconds(300);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EMBER_ERROR(new_process_group(store, 0, 2, "nccl", opt), "ProcessGroupNCCL setup (world 2, rank 0)",
                     "rank(s) 1 did not join within 300ms");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
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
