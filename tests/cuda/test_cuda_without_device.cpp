// What a CUDA build does on a machine without a GPU (CI's case): asking for the GPU or for
// page-locked memory raises a clear ember::Error, and DataLoader(pin_memory) quietly yields
// ordinary batches, as in PyTorch. Skips where a GPU is present.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>

#include "core/device_api.h"
#include "core/factory.h"
#include "data/dataloader.h"

using namespace ember;

namespace {

#define SKIP_WITH_A_GPU() \
  if (cuda_is_available()) GTEST_SKIP() << "a CUDA device is present"

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CudaWithoutDevice, PinMemoryRaisesNamingTheReason) {
  SKIP_WITH_A_GPU();
  const Tensor x = ember::ones({4, 3});
  EXPECT_FALSE(x.is_pinned());
  const std::string msg = message_of([&] { (void)x.pin_memory(); });
  EXPECT_NE(msg.find("pin_memory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("CUDA"), std::string::npos) << msg;
}

TEST(CudaWithoutDevice, MovingToTheGpuRaisesInsteadOfCrashing) {
  SKIP_WITH_A_GPU();
  const Tensor x = ember::ones({2, 2});
  const std::string msg = message_of([&] { (void)x.to(Device::cuda(0), /*non_blocking=*/true); });
  EXPECT_NE(msg.find("no CUDA device"), std::string::npos) << msg;
  EXPECT_EQ(cuda_device_count(), 0);
}

TEST(CudaWithoutDevice, DataLoaderPinMemoryYieldsOrdinaryBatches) {
  SKIP_WITH_A_GPU();
  auto ds = std::make_shared<data::TensorDataset>(
      std::map<std::string, Tensor>{{"x", ember::arange(int64_t(10))}});
  data::DataLoader loader(ds, {.batch_size = 4, .num_workers = 1, .pin_memory = true});
  int64_t seen = 0;
  for (auto& batch : loader) {
    EXPECT_FALSE(batch.at("x").is_pinned());
    EXPECT_TRUE(batch.at("x").is_cpu());
    seen += batch.size();
  }
  EXPECT_EQ(seen, 10);
}

}  // namespace
