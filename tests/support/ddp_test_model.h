// The model, data and training loops shared by the DDP tests (threads as ranks) and the
// ddp_worker program (processes as ranks). Everything is derived from seeds, so every rank
// and the single-process reference see exactly the same numbers.
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/grad_mode.h"
#include "distributed/ddp.h"
#include "nn/functional.h"
#include "nn/layers/basic.h"

namespace ember::ddp_test {

// Linear-ReLU-Linear-ReLU-Linear, plus an optional branch that forward uses only when asked
// (for unused-parameter tests) and an optional buffer (for buffer broadcast tests).
class Mlp : public nn::Module {
 public:
  Mlp(int64_t in, int64_t hidden, int64_t out, bool with_extra = false, bool with_buffer = false)
      : Module("Mlp") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(in, hidden));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(hidden, hidden));
    fc3 = register_module("fc3", std::make_shared<nn::Linear>(hidden, out));
    if (with_extra) extra = register_module("extra", std::make_shared<nn::Linear>(hidden, out));
    if (with_buffer) register_buffer("running", zeros({hidden}));
  }
  Tensor forward(const Tensor& x) override {
    auto scope = enter_forward();  // runs the wrappers' hooks, as every Ember module's forward does
    Tensor h = relu(fc2->forward(relu(fc1->forward(x))));
    Tensor y = fc3->forward(h);
    if (use_extra) y = y + extra->forward(h);
    return scope.exit(y);
  }
  std::shared_ptr<nn::Linear> fc1, fc2, fc3, extra;
  bool use_extra = false;
};

constexpr int64_t kIn = 6, kHidden = 16, kOut = 3;
// About 1 KB: the Mlp above then splits into three buckets.
constexpr double kSmallBucketMb = 1000.0 / (1024.0 * 1024.0);

inline Tensor uniform_tensor(uint64_t seed, const Shape& shape, double scale = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-scale, scale);
  std::vector<float> v(size_t(numel_of(shape)));
  for (auto& x : v) x = float(u(gen));
  return from_vector<float>(v, shape);
}

// Overwrites every parameter and buffer with values drawn from `seed`.
inline void fill_deterministic(nn::Module& m, uint64_t seed) {
  NoGradGuard no_grad;
  uint64_t k = 0;
  for (auto& [name, p] : m.named_parameters()) p.copy_(uniform_tensor(seed * 1000 + k++, p.shape(), 0.4));
  for (auto& [name, b] : m.named_buffers()) b.copy_(uniform_tensor(seed * 1000 + k++, b.shape(), 1.0));
}

inline std::shared_ptr<Mlp> make_mlp(uint64_t seed, bool with_extra = false, bool with_buffer = false) {
  auto m = std::make_shared<Mlp>(kIn, kHidden, kOut, with_extra, with_buffer);
  fill_deterministic(*m, seed);
  return m;
}

// Rows [first, first + count) of the global batch number `step` (of `global` rows).
inline std::pair<Tensor, Tensor> batch_rows(int step, int64_t global, int64_t first, int64_t count) {
  Tensor x = uniform_tensor(7000 + uint64_t(step), {global, kIn});
  Tensor y = uniform_tensor(9000 + uint64_t(step), {global, kOut});
  return {x.narrow(0, first, count).contiguous(), y.narrow(0, first, count).contiguous()};
}

inline void sgd_step(nn::Module& m, double lr) {
  NoGradGuard no_grad;
  for (auto& p : m.parameters())
    if (p.grad().defined()) p.add_(p.grad(), -lr);
  m.zero_grad();
}

struct TrainPlan {
  int steps = 5;
  int64_t per_rank_batch = 4;
  int micro_batches = 1;  // > 1: all but the last backward of a step run under no_sync()
  double lr = 0.1;
};

// Micro-batch `micro` of step `step` is global batch number step * micro_batches + micro.
inline void train_ddp(distributed::DistributedDataParallel& ddp, const TrainPlan& plan) {
  auto& model = *ddp.module();
  const int rank = ddp.process_group()->rank(), world = ddp.process_group()->size();
  const int64_t b = plan.per_rank_batch;
  for (int s = 0; s < plan.steps; ++s) {
    for (int m = 0; m < plan.micro_batches; ++m) {
      auto [x, y] = batch_rows(s * plan.micro_batches + m, b * world, b * rank, b);
      Tensor loss = nn::functional::mse_loss(ddp.forward(x), y) * (1.0 / plan.micro_batches);
      if (m + 1 < plan.micro_batches) {
        auto guard = ddp.no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    sgd_step(model, plan.lr);
  }
}

// The same plan on one process that sees every rank's rows at once.
inline void train_reference(nn::Module& model, const TrainPlan& plan, int world) {
  const int64_t global = plan.per_rank_batch * world;
  for (int s = 0; s < plan.steps; ++s) {
    for (int m = 0; m < plan.micro_batches; ++m) {
      auto [x, y] = batch_rows(s * plan.micro_batches + m, global, 0, global);
      (nn::functional::mse_loss(model.forward(x), y) * (1.0 / plan.micro_batches)).backward();
    }
    sgd_step(model, plan.lr);
  }
}

inline double max_abs_diff(const nn::Module& a, const nn::Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  EMBER_CHECK(pa.size() == pb.size(), "max_abs_diff: models differ in parameter count");
  double worst = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    auto va = pa[i].second.to_vector<float>(), vb = pb[i].second.to_vector<float>();
    for (size_t k = 0; k < va.size(); ++k) worst = std::max(worst, std::abs(double(va[k]) - double(vb[k])));
  }
  return worst;
}

// The largest elementwise distance of two runs' flat_parameters (infinity when sizes differ).
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::abs(a[i] - b[i])));
  return d;
}

// Every parameter's values, in registration order, end to end.
inline std::vector<float> flat_parameters(const nn::Module& m) {
  std::vector<float> out;
  for (const auto& p : m.parameters()) {
    auto v = p.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace ember::ddp_test
