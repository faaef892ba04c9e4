// Tensors of more than 2^31 elements on the GPU: contiguous and strided copies, a converting
// copy, full sums, tensor-tensor and tensor-scalar comparisons, and dropout forward and
// backward each index past element 2^31, where a 32-bit offset would wrap. Marks set at known
// positions beyond it must arrive where they belong and be counted. Skips without a GPU, and
// when the device has less free memory than the test needs (about 16 GiB).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/device_api.h"
#include "core/native/nn_functional.h"
#include "test_util.h"

using namespace ember;

namespace {

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();
constexpr int64_t kTwo31 = int64_t(1) << 31;
// Even (it is viewed as [2, kN / 2]) and 2 more than a multiple of 4 (dropout's last group of
// four elements is partial).
constexpr int64_t kN = kTwo31 + (int64_t(1) << 21) + 6;
constexpr int64_t kGiB = int64_t(1) << 30;

// Empty when the device has `bytes` free, else why not.
std::string lacks_memory(int64_t bytes) {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return "cudaMemGetInfo failed";
  }
  if (int64_t(free_bytes) >= bytes) return "";
  return "needs " + std::to_string(bytes / kGiB) + " GiB of free device memory, " +
         std::to_string(int64_t(free_bytes) / kGiB) + " GiB free";
}

#define SKIP_WITHOUT_GPU_MEMORY(bytes)                                      \
  do {                                                                      \
    if (!ember::cuda_is_available()) GTEST_SKIP() << "no CUDA device";      \
    const std::string why = lacks_memory(bytes);                            \
    if (!why.empty()) GTEST_SKIP() << why;                                  \
  } while (0)

int64_t count_true(const Tensor& b) { return sum(b).item<int64_t>(); }

double element(const Tensor& t, int64_t i, int64_t j) { return t.select(0, i).select(0, j).item_double(); }

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.to(kCpu).contiguous();
  const auto* p = static_cast<const uint8_t*>(c.raw_data());
  return std::vector<uint8_t>(p, p + size_t(c.numel()) * c.element_size());
}

}  // namespace

TEST(CudaLargeTensors, CopiesComparisonsAndSumsReachPastElement2To31) {
  SKIP_WITHOUT_GPU_MEMORY(16 * kGiB);
  const std::vector<int64_t> marks = {0, kTwo31 - 1, kTwo31, kTwo31 + 12345, kN - 1};
  const int64_t m = kN / 2;
  const Tensor x = zeros({kN}, {DType::boolean, kGpu});
  for (int64_t p : marks) x.narrow(0, p, 1).fill_(1.0);
  EXPECT_EQ(count_true(x), int64_t(marks.size()));
  EXPECT_EQ(count_true(eq(x, 1.0)), int64_t(marks.size())) << "tensor-scalar comparison";
  EXPECT_EQ(x.narrow(0, kTwo31, 1).item_double(), 1.0);
  EXPECT_EQ(x.narrow(0, kTwo31 + 1, 1).item_double(), 0.0);
  {
    // [2, m] transposed into [m, 2]: the copy kernel walks linear indices past 2^31 through a
    // two-dim geometry; element (i, j) of the result is x[j * m + i].
    const Tensor y = x.view({2, m}).t().contiguous();
    ASSERT_EQ(y.shape(), (Shape{m, 2}));
    for (int64_t p : marks) EXPECT_EQ(element(y, p % m, p / m), 1.0) << "mark at " << p;
    EXPECT_EQ(element(y, (kTwo31 + 1) % m, (kTwo31 + 1) / m), 0.0);
    const Tensor back = y.t().contiguous().view({kN});
    EXPECT_EQ(count_true(eq(back, x)), kN) << "transposed there and back, element for element";
    EXPECT_EQ(count_true(ne(back, x)), 0);
    EXPECT_EQ(count_true(back), int64_t(marks.size()));
  }
  {
    const Tensor c = x.clone();  // contiguous: one device-to-device copy
    EXPECT_EQ(count_true(eq(c, x)), kN);
  }
  {
    // converting copy (bool -> f16) and a floating sum over every element
    const Tensor h = x.to(DType::f16);
    EXPECT_EQ(h.narrow(0, kN - 1, 1).item_double(), 1.0);
    EXPECT_EQ(h.narrow(0, kN - 2, 1).item_double(), 0.0);
    EXPECT_EQ(count_true(eq(h, 1.0)), int64_t(marks.size()));
    EXPECT_EQ(count_true(gt(h, 0.5)), int64_t(marks.size()));
  }
}

TEST(CudaLargeTensors, DropoutForwardAndBackwardReachPastElement2To31) {
  SKIP_WITHOUT_GPU_MEMORY(20 * kGiB);
  const double p = 0.5, scale = 2.0;
  const GeneratorState st{0x5eedULL, 777};
  const Tensor x = full({kN}, 1.0, {DType::bf16, kGpu});
  const Tensor out = empty({kN}, {DType::bf16, kGpu});
  const Tensor mask = empty({kN}, {DType::boolean, kGpu});
  native::dropout_stub.call(kGpu, "dropout")(out, mask, x, p, scale, st);
  // Windows (starting on a group of four) around 2^31 and at the end, against the CPU's mask
  // for the same counters: element e draws word e % 4 of counter st.offset + e / 4.
  for (const int64_t first : {int64_t(0), kTwo31 - 64, kN - 66}) {
    const int64_t len = first == kN - 66 ? 66 : 128;
    SCOPED_TRACE("elements " + std::to_string(first) + " .. " + std::to_string(first + len - 1));
    const Tensor out_cpu = empty({len}, {DType::bf16, kCpu});
    const Tensor mask_cpu = empty({len}, {DType::boolean, kCpu});
    native::dropout_stub.call(kCpu, "dropout")(out_cpu, mask_cpu, full({len}, 1.0, {DType::bf16, kCpu}), p, scale,
                                               GeneratorState{st.seed, st.offset + uint64_t(first / 4)});
    EXPECT_EQ(bytes_of(mask.narrow(0, first, len)), bytes_of(mask_cpu));
    EXPECT_EQ(bytes_of(out.narrow(0, first, len)), bytes_of(out_cpu));
  }
  const int64_t kept = count_true(mask);
  EXPECT_LT(std::abs(double(kept) - double(kN) / 2), 6 * std::sqrt(double(kN)) / 2) << kept << " kept of " << kN;
  EXPECT_EQ(count_true(eq(out, 2.0)), kept);
  EXPECT_EQ(count_true(eq(out, 0.0)), kN - kept);
  const Tensor grad_in = empty({kN}, {DType::bf16, kGpu});
  native::dropout_backward_stub.call(kGpu, "dropout_backward")(grad_in, x, mask, scale);
  EXPECT_EQ(count_true(eq(grad_in, out)), kN) << "backward of ones is the forward's output";
}
