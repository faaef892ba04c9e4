#include "distributed/comm_hooks.h"

#include <cctype>
#include <mutex>
#include <utility>

#include "core/error.h"
#include "core/grad_mode.h"
#include "core/ops.h"
#include "distributed/powersgd_hook.h"

namespace ember::distributed {

namespace {

class ThenWork : public Work {
 public:
  ThenWork(std::shared_ptr<Work> inner, std::function<void()> then) : inner_(std::move(inner)), then_(std::move(then)) {}
  void wait() override {
    inner_->wait();  // rethrows the collective's error every time, as Work promises
    std::call_once(done_, [this] { then_(); });
  }
  bool is_completed() override { return inner_->is_completed(); }

 private:
  std::shared_ptr<Work> inner_;
  std::function<void()> then_;
  std::once_flag done_;
};

}  // namespace

std::shared_ptr<Work> then_work(std::shared_ptr<Work> inner, std::function<void()> then) {
  EMBER_CHECK(inner != nullptr, "then_work: the work is null");
  return std::make_shared<ThenWork>(std::move(inner), std::move(then));
}

const char* comm_hook_name(CommHookType t) {
  switch (t) {
    case CommHookType::NONE: return "no";
    case CommHookType::FP16: return "fp16";
    case CommHookType::BF16: return "bf16";
    case CommHookType::POWER_SGD: return "power_sgd";
  }
  return "?";
}

CommHookType parse_comm_hook(const std::string& name) {
  std::string v;
  for (char c : name) v.push_back(char(std::tolower(static_cast<unsigned char>(c))));
  if (v.empty() || v == "no" || v == "none") return CommHookType::NONE;
  if (v == "fp16") return CommHookType::FP16;
  if (v == "bf16") return CommHookType::BF16;
  if (v == "power_sgd" || v == "powersgd") return CommHookType::POWER_SGD;
  EMBER_FAIL("DDP comm hook '", name, "': expected no, fp16, bf16 or power_sgd");
}

std::shared_ptr<Work> allreduce_hook(GradBucket& bucket) {
  EMBER_CHECK(bucket.process_group != nullptr, "allreduce_hook: the bucket has no process group");
  Tensor buffer = bucket.buffer;
  const double inv_world = 1.0 / double(bucket.process_group->size());
  bucket.wire_bytes = buffer.numel() * int64_t(dtype_size(buffer.dtype()));
  return then_work(bucket.process_group->allreduce(buffer, ReduceOp::Sum), [buffer, inv_world]() mutable {
    NoGradGuard no_grad;
    buffer.mul_(inv_world);
  });
}

CommHook compress_hook(DType wire) {
  EMBER_CHECK(wire == DType::f16 || wire == DType::bf16, "compress_hook: the wire dtype must be f16 or bf16, got ",
              dtype_name(wire));
  return [wire](GradBucket& bucket) -> std::shared_ptr<Work> {
    EMBER_CHECK(bucket.process_group != nullptr, "compress_hook: the bucket has no process group");
    NoGradGuard no_grad;
    Tensor buffer = bucket.buffer;
    // Divide first, as torch does: the sum of fp16 values could overflow where the mean does not.
    Tensor compressed = mul(buffer, 1.0 / double(bucket.process_group->size())).to(wire);
    bucket.wire_bytes = compressed.numel() * int64_t(dtype_size(wire));
    return then_work(bucket.process_group->allreduce(compressed, ReduceOp::Sum), [buffer, compressed]() mutable {
      NoGradGuard inner_no_grad;
      buffer.copy_(compressed);
    });
  };
}

CommHook comm_hook_for(CommHookType t, const PowerSGDOptions& powersgd) {
  switch (t) {
    case CommHookType::NONE: return {};
    case CommHookType::FP16: return compress_hook(DType::f16);
    case CommHookType::BF16: return compress_hook(DType::bf16);
    case CommHookType::POWER_SGD: return powersgd_hook(powersgd);
  }
  return {};
}

}  // namespace ember::distributed
