// The device runtime as user code meets it: the caching allocator's statistics (in use, peak,
// reserved, segments given back by empty_cache), reuse of a freed block on its stream, no
// reuse while another stream recorded on the block still has work queued, event timing,
// pinned host memory (Tensor::pin_memory, non-blocking uploads, DataLoader(pin_memory)), the
// out-of-memory error, two threads allocating on their own streams at once, and a matmul and a
// fused kernel queued on a user stream. Every test skips without a CUDA device.
//
// Tests that need a stream to be busy for certain hold it with a host function that waits
// for the test to let go (StreamHold), instead of hoping that queued work is still running.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/device_api.h"
#include "core/native/fused.h"
#include "core/native/linalg.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "kernels/cuda/cuda_allocator.h"
#include "kernels/cuda/cuda_stream.h"
#include "test_util.h"

using namespace ember;
using ember::testing::random_tensor;
using ember::testing::uniform_int;

namespace {

const Device kGpu = Device::cuda(0);
constexpr int64_t kMiB = int64_t(1) << 20;

// Above the allocator's 10 MiB medium class: every such request gets a segment of its own.
int64_t large_floats() { return (int64_t(12) << 20) / 4 + uniform_int(0, 1 << 20); }

int64_t segments() { return cuda::cuda_allocator().segment_count(0); }

// Blocks `stream` (work queued after the hold waits) until release() or destruction; a safety
// deadline of 30 s keeps a failing test from hanging the process.
class StreamHold {
 public:
  explicit StreamHold(const cuda::Stream& stream) : stream_(stream) {
    const cudaError_t err = cudaLaunchHostFunc(stream.handle(), &StreamHold::wait_for_release, &released_);
    EXPECT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
  }
  ~StreamHold() {
    release();
    stream_.synchronize();
  }
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;
  void release() { released_.store(true); }

 private:
  static void CUDART_CB wait_for_release(void* flag) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    auto* released = static_cast<std::atomic<bool>*>(flag);
    while (!released->load() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  }
  cuda::Stream stream_;
  std::atomic<bool> released_{false};
};

// Starts from a device with no cached blocks, so that which block a request gets is known.
void clean_cache() {
  cuda_synchronize();
  cuda_empty_cache();
}

}  // namespace

TEST(CudaRuntime, AllocatorStatisticsRiseFallAndEmptyCacheReturnsSegments) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  clean_cache();
  cuda_reset_peak_memory_stats();  // earlier tests in this process may have left a higher peak
  const AllocatorStats s0 = cuda_memory_stats();
  const int64_t seg0 = segments();
  EXPECT_EQ(s0.peak_bytes_in_use, s0.bytes_in_use);
  EXPECT_GE(s0.bytes_reserved, s0.bytes_in_use);
  const int64_t na = large_floats(), nb = large_floats();
  int64_t da = 0;
  {
    const Tensor a = empty({na}, {DType::f32, kGpu});
    const AllocatorStats s1 = cuda_memory_stats();
    da = s1.bytes_in_use - s0.bytes_in_use;
    EXPECT_GE(da, na * 4);
    EXPECT_LT(da, na * 4 + 2 * kMiB);
    EXPECT_GE(s1.bytes_reserved - s0.bytes_reserved, da);
    EXPECT_GE(s1.peak_bytes_in_use, s1.bytes_in_use);
    EXPECT_EQ(s1.num_allocations, s0.num_allocations + 1);
    EXPECT_EQ(s1.num_cache_hits, s0.num_cache_hits);
    EXPECT_EQ(segments(), seg0 + 1);
    {
      const Tensor b = empty({nb}, {DType::f32, kGpu});
      const AllocatorStats s2 = cuda_memory_stats();
      EXPECT_GE(s2.bytes_in_use - s1.bytes_in_use, nb * 4);
      EXPECT_EQ(s2.peak_bytes_in_use, s2.bytes_in_use) << "two live blocks are the high-water mark";
      EXPECT_EQ(segments(), seg0 + 2);
    }
    const AllocatorStats s3 = cuda_memory_stats();
    EXPECT_EQ(s3.bytes_in_use, s1.bytes_in_use) << "b's bytes are no longer in use";
    EXPECT_GT(s3.peak_bytes_in_use, s3.bytes_in_use) << "the peak remembers b";
    EXPECT_GT(s3.bytes_reserved, s3.bytes_in_use) << "b's segment stays cached";
    EXPECT_EQ(segments(), seg0 + 2);
  }
  const AllocatorStats s4 = cuda_memory_stats();
  EXPECT_EQ(s4.bytes_in_use, s0.bytes_in_use);
  cuda_reset_peak_memory_stats();
  EXPECT_EQ(cuda_memory_stats().peak_bytes_in_use, s0.bytes_in_use);
  cuda_empty_cache();
  const AllocatorStats s5 = cuda_memory_stats();
  EXPECT_EQ(segments(), seg0) << "empty_cache gives both wholly free segments back";
  EXPECT_EQ(s5.bytes_reserved, s0.bytes_reserved);
  EXPECT_EQ(s5.bytes_in_use, s0.bytes_in_use);
  // A live tensor's segment is not given back.
  const Tensor c = empty({na}, {DType::f32, kGpu});
  cuda_empty_cache();
  EXPECT_EQ(segments(), seg0 + 1);
  EXPECT_EQ(cuda_memory_stats().bytes_in_use - s0.bytes_in_use, da) << "the same request, the same rounding";
}

TEST(CudaRuntime, AFreedBlockIsReusedOnTheSameStream) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  clean_cache();
  const int64_t n = large_floats();
  const void* first = nullptr;
  {
    const Tensor a = full({n}, 3.0, {DType::f32, kGpu});
    first = a.raw_data();
  }
  const AllocatorStats before = cuda_memory_stats();
  const Tensor b = empty({n}, {DType::f32, kGpu});
  EXPECT_EQ(b.raw_data(), first);
  const AllocatorStats after = cuda_memory_stats();
  EXPECT_EQ(after.num_cache_hits, before.num_cache_hits + 1);
  EXPECT_EQ(after.bytes_reserved, before.bytes_reserved) << "served from the cache, not the driver";
  // While b holds the block, another request must go elsewhere.
  const Tensor c = empty({n}, {DType::f32, kGpu});
  EXPECT_NE(c.raw_data(), first) << "b still holds the block";
}

TEST(CudaRuntime, NoReuseAcrossStreamsWhileARecordedStreamHasWorkQueued) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  clean_cache();
  const int64_t n = large_floats();
  // Two cached blocks of this size on the main stream, so that nothing below needs the driver
  // (cudaMalloc) while the side stream is held.
  {
    const Tensor r1 = empty({n}, {DType::f32, kGpu}), r2 = empty({n}, {DType::f32, kGpu});
  }
  cuda::Stream side(kGpu);
  const Tensor host = random_tensor({n});
  Tensor x = host.to(kGpu);
  Tensor y;
  {
    cuda::StreamGuard on(side);
    y = empty({n}, {DType::f32, kGpu});
  }
  side.wait(cuda::current().record());  // x's upload comes first
  const void* px = x.raw_data();
  {
    StreamHold hold(side);
    {
      cuda::StreamGuard on(side);
      y.copy_(x);  // queued behind the hold: reads x later
    }
    cuda::record_stream(x, side.handle());
    x = Tensor();  // freed on the host while the side stream has yet to read it
    Tensor z = empty({n}, {DType::f32, kGpu});
    EXPECT_NE(z.raw_data(), px) << "x's block was handed out while the side stream still reads it";
    z.fill_(-7.0);  // would overwrite y's source had the block been reused
    EXPECT_FALSE(side.query()) << "the hold keeps the side stream busy";
    hold.release();
    side.synchronize();
  }
  cuda_synchronize();
  EXPECT_TRUE(side.query());
  EXPECT_EQ(y.to_vector<float>(), host.to_vector<float>());
  // Once the side stream's work finished, x's block is free for the main stream again: with
  // z gone too, the two cached blocks of this size are x's and z's, and two requests get both.
  const Tensor w1 = empty({n}, {DType::f32, kGpu}), w2 = empty({n}, {DType::f32, kGpu});
  EXPECT_TRUE(w1.raw_data() == px || w2.raw_data() == px) << "the recorded block never came back";
}

TEST(CudaRuntime, EventsOrderStreamsAndTimeACopy) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = int64_t(1) << 26;  // 256 MiB of f32
  const double v = double(uniform_int(1, 100));
  const Tensor big = full({n}, v, {DType::f32, kGpu});
  cuda::Event start(true), stop(true);
  start.record(cuda::current());
  Tensor copy = big.clone();
  for (int i = 0; i < 3; ++i) copy = add(copy, big);
  stop.record(cuda::current());
  stop.synchronize();
  EXPECT_TRUE(stop.query());
  const float ms = start.elapsed_ms(stop);
  EXPECT_GT(ms, 0.0f);
  EXPECT_LT(ms, 10000.0f);
  EXPECT_EQ(amax(copy).item<double>(), 4 * v);
  EXPECT_EQ(amin(copy).item<double>(), 4 * v);
  // Events made without timing cannot be timed.
  cuda::Event a, b;
  a.record(cuda::current());
  b.record(cuda::current());
  b.synchronize();
  EXPECT_THROW(a.elapsed_ms(b), ember::Error);
  // An event orders a side stream after the main stream's work.
  cuda::Stream side(kGpu);
  Tensor src = full({n / 4}, 2.0, {DType::f32, kGpu});
  src = mul(src, 3.0);  // queued on the main stream
  side.wait(cuda::current().record());
  Tensor out;
  {
    cuda::StreamGuard on(side);
    out = add(src, 1.0);
  }
  cuda::record_stream(src, side.handle());
  side.synchronize();
  EXPECT_EQ(amin(out).item<double>(), 7.0);
  EXPECT_EQ(amax(out).item<double>(), 7.0);
}

TEST(CudaRuntime, PinnedMemoryUploadsWithoutBlockingAndKeepsValues) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : {DType::f32, DType::bf16, DType::i64}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t rows = uniform_int(1, 300), cols = uniform_int(1, 700);
    const Tensor t = dt == DType::i64 ? ember::testing::random_index({rows, cols}, 1000000)
                                      : random_tensor({rows, cols}, dt);
    EXPECT_FALSE(t.is_pinned());
    const Tensor p = t.pin_memory();
    EXPECT_TRUE(p.is_pinned());
    EXPECT_EQ(p.device(), Device::cpu());
    EXPECT_EQ(p.shape(), t.shape());
    EXPECT_EQ(p.to_vector<double>(), t.to_vector<double>());
    const Tensor g = p.to(kGpu, /*non_blocking=*/true);
    EXPECT_EQ(g.device(), kGpu);
    EXPECT_FALSE(g.is_pinned());
    cuda_synchronize();
    EXPECT_EQ(g.to_vector<double>(), t.to_vector<double>());
    // A strided view pins as a copy with the view's values.
    const Tensor tt = t.t();
    const Tensor pt = tt.pin_memory();
    EXPECT_TRUE(pt.is_pinned());
    EXPECT_EQ(pt.to_vector<double>(), tt.to_vector<double>());
    const Tensor gt = pt.to(kGpu, true);
    cuda_synchronize();
    EXPECT_EQ(gt.to_vector<double>(), tt.to_vector<double>());
    EXPECT_EMBER_ERROR(g.pin_memory(), "pin_memory", "only CPU tensors");
  }
}

TEST(CudaRuntime, DataLoaderWithPinMemoryYieldsPinnedBatches) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = uniform_int(9, 40), features = uniform_int(1, 9);
  const Tensor x = random_tensor({n, features});
  const Tensor y = arange(n);
  auto dataset = std::make_shared<data::TensorDataset>(std::map<std::string, Tensor>{{"x", x}, {"y", y}});
  for (int workers : {0, 2}) {
    SCOPED_TRACE("workers " + std::to_string(workers));
    data::DataLoader pinned(dataset, {.batch_size = 4, .num_workers = workers, .pin_memory = true});
    std::vector<float> xs;
    std::vector<int64_t> ys;
    int64_t batches = 0;
    for (auto& batch : pinned) {
      ++batches;
      EXPECT_TRUE(batch.at("x").is_pinned());
      EXPECT_TRUE(batch.at("y").is_pinned());
      const Batch on_gpu = batch.to(kGpu, /*non_blocking=*/true);
      EXPECT_EQ(on_gpu.at("x").device(), kGpu);
      cuda_synchronize();
      const auto bx = on_gpu.at("x").to_vector<float>();
      const auto by = on_gpu.at("y").to_vector<int64_t>();
      xs.insert(xs.end(), bx.begin(), bx.end());
      ys.insert(ys.end(), by.begin(), by.end());
    }
    EXPECT_EQ(batches, (n + 3) / 4);
    EXPECT_EQ(xs, x.to_vector<float>());
    EXPECT_EQ(ys, y.to_vector<int64_t>());
    data::DataLoader plain(dataset, {.batch_size = 4, .num_workers = workers});
    for (auto& batch : plain) EXPECT_FALSE(batch.at("x").is_pinned());
  }
}

TEST(CudaRuntime, OutOfMemoryNamesTheSizeAndLeavesTheAllocatorUsable) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  cuda_synchronize();
  const AllocatorStats before = cuda_memory_stats();
  // 512 GiB: more than any single GPU has; the message gives it in MiB.
  EXPECT_EMBER_ERROR(empty({int64_t(1) << 37}, {DType::f32, kGpu}), "CUDA out of memory",
                     "tried to allocate 524288.0 MiB", "cuda:0", "MiB free", "held by tensors");
  // 1 PiB, as a huge empty tensor.
  EXPECT_EMBER_ERROR(empty({int64_t(1) << 47}, {DType::f64, kGpu}), "CUDA out of memory", "tried to allocate",
                     "cuda:0");
  const AllocatorStats after = cuda_memory_stats();
  EXPECT_EQ(after.bytes_in_use, before.bytes_in_use) << "a failed allocation holds nothing";
  // The allocator still serves requests afterwards.
  const double v = double(uniform_int(1, 50));
  const Tensor t = full({1000}, v, {DType::f32, kGpu});
  EXPECT_EQ(amax(t).item<double>(), v);
}

TEST(CudaRuntime, TwoThreadsAllocateAndFreeOnTheirOwnStreams) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  clean_cache();
  const AllocatorStats s0 = cuda_memory_stats();
  const uint64_t seed = ember::testing::test_seed();
  std::string errors[2];
  auto work = [&](int id) {
    try {
      cuda::Stream stream(kGpu);
      cuda::StreamGuard on(stream);
      std::mt19937_64 gen(seed * 2 + uint64_t(id));
      std::uniform_int_distribution<int64_t> size(1, 1 << 18);
      std::deque<std::pair<Tensor, double>> live;
      for (int iter = 0; iter < 150; ++iter) {
        const double value = double(id * 1000 + iter);
        live.emplace_back(full({size(gen)}, value, {DType::f32, kGpu}), value);
        if (live.size() > 5) {
          // The oldest tensor still holds its own value: no other thread's block overlapped it.
          const auto& [t, v] = live.front();
          const double lo = amin(t).item<double>(), hi = amax(t).item<double>();
          if (lo != v || hi != v)
            errors[id] += "iteration " + std::to_string(iter) + ": expected " + std::to_string(v) + ", found [" +
                          std::to_string(lo) + ", " + std::to_string(hi) + "]\n";
          live.pop_front();
        }
      }
      live.clear();
      stream.synchronize();
    } catch (const std::exception& e) {
      errors[id] += std::string("exception: ") + e.what();
    }
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  cuda_synchronize();
  const AllocatorStats s1 = cuda_memory_stats();
  EXPECT_EQ(s1.bytes_in_use, s0.bytes_in_use) << "every block came back";
  EXPECT_GE(s1.num_allocations - s0.num_allocations, 300);
  EXPECT_GT(s1.num_cache_hits, s0.num_cache_hits) << "freed blocks were reused";
}

// Kernels queue on the thread's current stream. While a user stream is held, a matmul with a
// bias and the fused bias+GELU backward (its chunked bias sums and their scratch buffer) issued
// on it must not have run: their poisoned outputs, read through a second stream, are
// untouched. Once released, the results are those of the same calls on the default stream.
TEST(CudaRuntime, MatmulAndFusedKernelsRunOnTheCurrentStream) {
  if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor a = random_tensor({64, 96}).to(kGpu), b = random_tensor({96, 80}).to(kGpu);
  const Tensor bias = random_tensor({80}).to(kGpu);
  const Tensor x = random_tensor({300, 80}).to(kGpu), g = random_tensor({300, 80}).to(kGpu);
  const Tensor gelu_bias = random_tensor({80}).to(kGpu);
  const auto matmul = native::matmul_stub.call(kGpu, "matmul");
  const auto gelu_backward = native::bias_gelu_backward_stub.call(kGpu, "bias_gelu_backward");
  // on the default stream first
  const Tensor want_mm = empty({64, 80}, {DType::f32, kGpu});
  const Tensor want_dx = empty({300, 80}, {DType::f32, kGpu}), want_db = empty({80}, {DType::f32, kGpu});
  matmul(want_mm, a, b, bias);
  gelu_backward(want_dx, want_db, g, x, gelu_bias, false);
  const Tensor mm = full({64, 80}, nan, {DType::f32, kGpu});
  const Tensor dx = full({300, 80}, nan, {DType::f32, kGpu}), db = full({80}, nan, {DType::f32, kGpu});
  cuda_synchronize();

  cuda::Stream side(kGpu), reader(kGpu);
  // Every element of t (f32) as read on `reader`, which is not ordered after `side`.
  const auto read_now = [&](const Tensor& t) {
    std::vector<float> host(size_t(t.numel()));
    EXPECT_EQ(cudaMemcpyAsync(host.data(), t.raw_data(), host.size() * sizeof(float), cudaMemcpyDeviceToHost,
                              reader.handle()),
              cudaSuccess);
    reader.synchronize();
    return host;
  };
  const auto all_nan = [](const std::vector<float>& v) {
    for (float f : v)
      if (!std::isnan(f)) return false;
    return true;
  };
  {
    StreamHold hold(side);
    {
      cuda::StreamGuard on(side);
      matmul(mm, a, b, bias);
      gelu_backward(dx, db, g, x, gelu_bias, false);
    }
    EXPECT_TRUE(all_nan(read_now(mm))) << "the matmul ran before its stream was released";
    EXPECT_TRUE(all_nan(read_now(dx))) << "bias_gelu_backward's dx was written before its stream was released";
    EXPECT_TRUE(all_nan(read_now(db))) << "the bias gradient was written before its stream was released";
  }  // released, and `side` synchronized
  EXPECT_EQ(read_now(mm), read_now(want_mm));
  EXPECT_EQ(read_now(dx), read_now(want_dx));
  EXPECT_EQ(read_now(db), read_now(want_db));
}
