// One rank of a SyncBatchNorm job, started by tests/distributed/test_sync_batch_norm.cpp with
// RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT on loopback (the process group is the Accelerator
// state's):
//
//   syncbn_worker match <hw> <rows of rank 0> <rows of rank 1> ...
//       every rank takes its rows of one batch [sum rows, C, hw, hw]; over two training steps the
//       outputs, this rank's input gradients, the weight and bias gradients summed over ranks
//       and the running statistics must equal one BatchNorm2d on the whole batch, and an
//       evaluation forward must equal it without any collective; once through the default
//       group, once through a group passed explicitly (momentum 0.1 with affine parameters,
//       then the cumulative average without). Counts the collectives: one all-reduce of 2C + 1
//       values per training forward, one of 2C per backward, the channel check once. Prints
//       "match ok".
//   syncbn_worker penalty <hw> <rows of rank 0> <rows of rank 1> ...
//       second-order gradients: the gradient penalty of WGAN-GP, the sum over samples n of
//       (||d loss / d x_n|| - 1)^2 with loss the sum of tanh(y) times a target, differentiated
//       into x, weight and bias (per-sample norms: ||d loss / d x||^2 alone is blind to a term
//       constant over each channel, as BatchNorm's input gradient sums to zero). Each rank's input
//       gradient and penalty gradient of x must equal its rows of one process's BatchNorm on the
//       whole batch, and the weight and bias gradients summed over ranks that process's: in f64
//       through sync_batch_norm to 1e-9, in f32 through the SyncBatchNorm layer to 1e-5. Counts
//       the f64 run's all-reduces: 2C + 1 forward; 2C and four of C in the backward with
//       create_graph; the penalty's backward four of C and 2C (the first-order formula again, as
//       dloss/dy depends on y). Prints "penalty ok".
//   syncbn_worker mismatch
//       rank 1's layer has one channel more: the first training forward fails on every rank,
//       naming rank 1 and both channel counts; prints "mismatch ok".
//   syncbn_worker accel <steps> <rows per rank>
//       Linear -> BatchNorm1d -> ReLU -> Linear converted by convert_sync_batchnorm (after the
//       optimizer was built), prepared by the Accelerator, AdamW on this rank's rows of each
//       batch: the parameters and running statistics must equal one process on the whole
//       batches; prints "accel ok".
// Exit status 0 when every expectation held.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "accelerate/accelerator.h"
#include "accelerate/accelerator_state.h"
#include "autograd/engine.h"
#include "ddp_test_model.h"
#include "distributed/default_process_group.h"
#include "distributed/sync_batch_norm.h"
#include "nn/functional.h"
#include "nn/layers/basic.h"
#include "nn/layers/containers.h"
#include "optim/sgd_adam.h"
#include "worker_expect.h"

using namespace ember;
using namespace ember::distributed;
using ember::ddp_test::uniform_tensor;
using ember::testing::expect;

namespace {

constexpr auto kTimeout = std::chrono::seconds(120);  // longer than the test's deadline: a hang fails the test
constexpr int64_t kChannels = 3;
constexpr double kTolerance = 1e-5;
bool& failed = ember::testing::worker_failed();

// The largest |a - b| / (1 + |b|) over the elements (undefined b: a must be undefined too).
double distance(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined() ? 0.0 : 1e30;
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  if (x.size() != y.size()) return 1e30;
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]) / (1 + std::abs(y[i])));
  return worst;
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what, double tolerance = kTolerance) {
  const double d = distance(got, want);
  if (d > tolerance) std::printf("%s: distance %.3g\n", what.c_str(), d);
  expect(d <= tolerance, what + " matches one process on the whole batch");
}

// Passes every collective to `inner`, counting the calls and the values they reduce.
class CountingGroup : public ProcessGroup {
 public:
  explicit CountingGroup(std::shared_ptr<ProcessGroup> inner)
      : ProcessGroup(inner->rank(), inner->size()), inner_(std::move(inner)) {}
  std::string backend_name() const override { return inner_->backend_name(); }
  std::shared_ptr<Work> allreduce(Tensor tensor, ReduceOp op) override {
    allreduce_sizes.push_back(tensor.numel());
    return inner_->allreduce(std::move(tensor), op);
  }
  std::shared_ptr<Work> broadcast(Tensor tensor, int root) override {
    ++others;
    return inner_->broadcast(std::move(tensor), root);
  }
  std::vector<Tensor> allgather(const Tensor& tensor) override {
    ++others;
    return inner_->allgather(tensor);
  }
  std::shared_ptr<Work> allgather_into(Tensor output, const Tensor& input) override {
    ++others;
    return inner_->allgather_into(std::move(output), input);
  }
  std::shared_ptr<Work> reduce_scatter(Tensor output, const Tensor& input, ReduceOp op) override {
    ++others;
    return inner_->reduce_scatter(std::move(output), input, op);
  }
  void barrier() override { inner_->barrier(); }
  std::vector<Bytes> allgather_bytes(const Bytes& mine) override {
    ++byte_gathers;
    return inner_->allgather_bytes(mine);
  }

  std::vector<int64_t> allreduce_sizes;
  int byte_gathers = 0, others = 0;

 private:
  std::shared_ptr<ProcessGroup> inner_;
};

// Parameters and running statistics drawn from `seed` (running_var in [0.5, 1.5]);
// num_batches_tracked stays 0.
void fill_values(nn::Module& m, uint64_t seed) {
  NoGradGuard no_grad;
  uint64_t k = 0;
  for (auto& [name, p] : m.named_parameters()) p.copy_(uniform_tensor(seed * 1000 + k++, p.shape(), 0.5));
  for (auto& [name, b] : m.named_buffers()) {
    if (name.find("num_batches_tracked") != std::string::npos) continue;
    const bool var = name.find("running_var") != std::string::npos;
    b.copy_(uniform_tensor(seed * 1000 + k++, b.shape(), 0.5) + (var ? 1.0 : 0.0));
  }
}

// Sums a copy of `t` over the ranks (the real group, not the counted one).
Tensor summed(const Tensor& t, ProcessGroup& pg) {
  Tensor copy = t.clone();
  pg.allreduce(copy)->wait();
  return copy;
}

void check_match(ProcessGroup& pg, const std::vector<int64_t>& rows, int64_t hw, bool explicit_group,
                 const nn::BatchNormOptions& options) {
  const int rank = pg.rank();
  const int64_t total = [&] { int64_t t = 0; for (auto r : rows) t += r; return t; }();
  int64_t offset = 0;
  for (int r = 0; r < rank; ++r) offset += rows[size_t(r)];
  const int64_t mine = rows[size_t(rank)];
  const std::string label = std::string(explicit_group ? "explicit group" : "default group") + ", rows " +
                            std::to_string(mine) + " of " + std::to_string(total) + ": ";

  auto counted = std::make_shared<CountingGroup>(default_process_group());
  nn::BatchNorm2d reference(kChannels, options);
  std::shared_ptr<nn::SyncBatchNorm> sync;
  if (explicit_group) {
    sync = std::make_shared<nn::SyncBatchNorm>(kChannels, options, counted);
  } else {
    set_default_process_group(counted);
    sync = std::make_shared<nn::SyncBatchNorm>(kChannels, options);
    expect(sync->process_group() == counted, "the layer uses the default group");
  }
  fill_values(reference, 3);
  fill_values(*sync, 3);

  for (int step = 0; step < 2; ++step) {
    const Shape whole{total, kChannels, hw, hw};
    const Tensor x_all = uniform_tensor(100 + uint64_t(step), whole, 2.0);
    const Tensor g_all = uniform_tensor(200 + uint64_t(step), whole);
    Tensor x_ref = x_all.clone().requires_grad_(true);
    Tensor y_ref = reference.forward(x_ref);
    (y_ref * g_all).sum().backward();

    Tensor x = x_all.narrow(0, offset, mine).clone().requires_grad_(true);
    Tensor y = sync->forward(x);
    (y * g_all.narrow(0, offset, mine)).sum().backward();
    const std::string at = label + "step " + std::to_string(step) + " ";
    expect_close(y, y_ref.narrow(0, offset, mine), at + "output");
    expect_close(x.grad(), x_ref.grad().narrow(0, offset, mine), at + "input gradient");
    if (options.affine) {
      expect_close(summed(sync->weight.grad(), pg), reference.weight.grad(), at + "summed weight gradient");
      expect_close(summed(sync->bias.grad(), pg), reference.bias.grad(), at + "summed bias gradient");
    }
    if (options.track_running_stats) {
      expect_close(sync->running_mean, reference.running_mean, at + "running_mean");
      expect_close(sync->running_var, reference.running_var, at + "running_var");
      expect(sync->num_batches_tracked.item<int64_t>() == step + 1, at + "num_batches_tracked counts the steps");
    }
    reference.zero_grad();
    sync->zero_grad();
  }
  const std::vector<int64_t> training_sizes = counted->allreduce_sizes;
  const std::vector<int64_t> expected{2 * kChannels + 1, 2 * kChannels, 2 * kChannels + 1, 2 * kChannels};
  expect(training_sizes == expected, label + "each step all-reduces 2C + 1 values forward and 2C backward");
  expect(counted->byte_gathers == 1 && counted->others == 0, label + "the channel counts are exchanged once");

  reference.eval();
  sync->eval();
  const Tensor x_all = uniform_tensor(300, {total, kChannels, hw, hw}, 2.0);
  const Tensor y_ref = reference.forward(x_all);
  const Tensor y = sync->forward(x_all.narrow(0, offset, mine));
  expect_close(y, y_ref.narrow(0, offset, mine), label + "evaluation output");
  expect(counted->allreduce_sizes.size() == training_sizes.size() && counted->byte_gathers == 1,
         label + "evaluation runs no collective");
  std::printf("rank %d %s%zu all-reduces of sizes", rank, label.c_str(), training_sizes.size());
  for (auto n : training_sizes) std::printf(" %lld", (long long)n);
  std::printf("\n");
}

int run_match(int64_t hw, const std::vector<int64_t>& rows) {
  auto state = AcceleratorState::initialize(true, kTimeout);
  const auto real = state->process_group();
  expect(real != nullptr && default_process_group() == real, "the Accelerator state's group is the default one");
  expect(size_t(state->num_processes()) == rows.size(), "one row count per rank");
  if (failed) return 1;
  check_match(*real, rows, hw, false, {});
  set_default_process_group(real);
  check_match(*real, rows, hw, true, {.momentum = std::nullopt, .affine = false});
  state->wait_for_everyone();
  if (!failed) std::printf("match ok\n");
  return failed ? 1 : 0;
}

// What the gradient penalty gives: the input gradient d loss / d x (kept with create_graph) and
// the penalty's gradients of x, weight and bias.
struct PenaltyGradients {
  Tensor input_gradient, x, weight, bias;
};

// loss = sum(tanh(norm(x)) * target), penalty = sum over samples of (||d loss / d x_n|| - 1)^2,
// backpropagated. after_first runs between the backward with create_graph and the penalty's.
PenaltyGradients penalty_gradients(const std::function<Tensor(const Tensor&)>& norm, const Tensor& x_values,
                                   const Tensor& target, const Tensor& weight, const Tensor& bias,
                                   const std::function<void()>& after_first = [] {}) {
  Tensor x = x_values.clone().requires_grad_(true);
  const Tensor gx = autograd::grad({sum(mul(tanh(norm(x)), target))}, {x}, {}, /*create_graph=*/true)[0];
  after_first();
  const Tensor norms = sqrt(sum(mul(gx, gx), {1, 2, 3}));
  sum(pow(sub(norms, 1.0), 2.0)).backward();
  return {gx.detach(), x.grad(), weight.grad(), bias.grad()};
}

void expect_penalty_match(const PenaltyGradients& got, const PenaltyGradients& want, ProcessGroup& pg, int64_t offset,
                          int64_t rows, const std::string& label, double tolerance) {
  expect_close(got.input_gradient, want.input_gradient.narrow(0, offset, rows), label + "input gradient", tolerance);
  expect_close(got.x, want.x.narrow(0, offset, rows), label + "penalty gradient of x", tolerance);
  expect_close(summed(got.weight, pg), want.weight, label + "summed penalty gradient of the weight", tolerance);
  expect_close(summed(got.bias, pg), want.bias, label + "summed penalty gradient of the bias", tolerance);
  const double size = distance(want.x, zeros_like(want.x)) + distance(want.weight, zeros_like(want.weight)) +
                      distance(want.bias, zeros_like(want.bias));
  expect(size > 1e-3, label + "the penalty moves x, weight and bias");
}

int run_penalty(int64_t hw, const std::vector<int64_t>& rows) {
  auto state = AcceleratorState::initialize(true, kTimeout);
  const auto real = state->process_group();
  expect(size_t(state->num_processes()) == rows.size(), "one row count per rank");
  if (failed) return 1;
  const int rank = real->rank();
  int64_t total = 0, offset = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    if (int(r) < rank) offset += rows[r];
    total += rows[r];
  }
  const int64_t mine = rows[size_t(rank)];
  const Shape whole{total, kChannels, hw, hw};
  constexpr double eps = 1e-3;
  const std::string label = "rows " + std::to_string(mine) + " of " + std::to_string(total) + ": ";

  {  // f64 through sync_batch_norm, counting its collectives
    const Tensor x_all = uniform_tensor(600, whole, 2.0).to(DType::f64);
    const Tensor target = uniform_tensor(601, whole).to(DType::f64);
    const Tensor w0 = (uniform_tensor(602, {kChannels}, 0.5) + 1.0).to(DType::f64);
    const Tensor b0 = uniform_tensor(603, {kChannels}).to(DType::f64);
    const Tensor w_ref = w0.clone().requires_grad_(true), b_ref = b0.clone().requires_grad_(true);
    const PenaltyGradients want = penalty_gradients(
        [&](const Tensor& x) { return batch_norm(x, Tensor(), Tensor(), w_ref, b_ref, true, 0.1, eps); }, x_all, target,
        w_ref, b_ref);

    auto counted = std::make_shared<CountingGroup>(real);
    const Tensor w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
    const Tensor running_mean = zeros({kChannels}, {DType::f64}), running_var = ones({kChannels}, {DType::f64});
    std::vector<int64_t> forward_sizes, first_sizes;
    const PenaltyGradients got = penalty_gradients(
        [&](const Tensor& x) {
          const Tensor y = sync_batch_norm(x, running_mean, running_var, w, b, 0.1, eps, counted);
          forward_sizes = counted->allreduce_sizes;
          return y;
        },
        x_all.narrow(0, offset, mine), target.narrow(0, offset, mine), w, b,
        [&] { first_sizes = counted->allreduce_sizes; });
    expect_penalty_match(got, want, *real, offset, mine, "f64 " + label, 1e-9);

    const int64_t c = kChannels;
    expect(forward_sizes == std::vector<int64_t>{2 * c + 1}, label + "the forward all-reduces 2C + 1 values");
    expect(first_sizes == std::vector<int64_t>{2 * c + 1, 2 * c, c, c, c, c},
           label + "the backward with create_graph all-reduces 2C, then four sums of C");
    std::vector<int64_t> second(counted->allreduce_sizes.begin() + int64_t(first_sizes.size()),
                                counted->allreduce_sizes.end());
    std::sort(second.begin(), second.end());
    expect(second == std::vector<int64_t>{c, c, c, c, 2 * c},
           label + "the penalty's backward all-reduces four of C and 2C");
    std::printf("rank %d penalty %s%zu all-reduces of sizes", rank, label.c_str(), counted->allreduce_sizes.size());
    for (auto n : counted->allreduce_sizes) std::printf(" %lld", (long long)n);
    std::printf("\n");
  }
  {  // f32 through the layers
    const Tensor x_all = uniform_tensor(700, whole, 2.0), target = uniform_tensor(701, whole);
    nn::BatchNorm2d reference(kChannels, {.eps = eps});
    nn::SyncBatchNorm sync(kChannels, {.eps = eps}, real);
    fill_values(reference, 4);
    fill_values(sync, 4);
    const PenaltyGradients want = penalty_gradients([&](const Tensor& x) { return reference.forward(x); }, x_all,
                                                    target, reference.weight, reference.bias);
    const PenaltyGradients got =
        penalty_gradients([&](const Tensor& x) { return sync.forward(x); }, x_all.narrow(0, offset, mine),
                          target.narrow(0, offset, mine), sync.weight, sync.bias);
    expect_penalty_match(got, want, *real, offset, mine, "f32 layers " + label, kTolerance);
  }
  state->wait_for_everyone();
  if (!failed) std::printf("penalty ok\n");
  return failed ? 1 : 0;
}

int run_mismatch() {
  auto state = AcceleratorState::initialize(true, kTimeout);
  const int rank = state->process_index();
  const int64_t channels = rank == 1 ? kChannels + 1 : kChannels;
  nn::SyncBatchNorm bn(channels);
  try {
    bn.forward(uniform_tensor(5, {2, channels, 2, 2}));
    expect(false, "a channel mismatch is an error");
  } catch (const Error& e) {
    std::printf("rank %d error: %s\n", rank, e.what());
    const std::string want = "rank 1 has " + std::to_string(kChannels + 1) + " channels (num_features) but rank 0 has " +
                             std::to_string(kChannels);
    expect(std::string(e.what()).find(want) != std::string::npos, "the error names rank 1 and both channel counts");
  }
  state->wait_for_everyone();
  if (!failed) std::printf("mismatch ok\n");
  return failed ? 1 : 0;
}

// The first Linear has no bias, as before any batch norm: the normalisation cancels a bias, so
// its gradient is rounding noise, which AdamW would blow up to steps of the learning rate.
std::shared_ptr<nn::Sequential> make_model(uint64_t seed) {
  auto model = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 8, nn::LinearOptions{.bias = false}), std::make_shared<nn::BatchNorm1d>(8), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(8, 2)});
  fill_values(*model, seed);
  return model;
}

int run_accel(int64_t steps, int64_t rows) {
  Accelerator acc({.cpu = true});
  const int rank = acc.process_index(), world = acc.num_processes();
  const optim::AdamWOptions adamw{.lr = 0.01};
  auto batch = [&](int64_t step) {
    return std::pair{uniform_tensor(400 + uint64_t(step), {world * rows, 6}),
                     uniform_tensor(500 + uint64_t(step), {world * rows, 2})};
  };

  auto reference = make_model(1);
  optim::AdamW ref_opt(reference->parameters(), adamw);
  for (int64_t s = 0; s < steps; ++s) {
    auto [x, y] = batch(s);
    nn::functional::mse_loss(reference->forward(x), y).backward();
    ref_opt.step();
    ref_opt.zero_grad();
  }

  std::shared_ptr<nn::Module> model = make_model(1 + uint64_t(rank));  // DDP starts every rank from rank 0's
  optim::AdamW opt(model->parameters(), adamw);                         // built before the conversion
  model = nn::convert_sync_batchnorm(model);
  expect(model->named_children()[1].second->type_name() == "SyncBatchNorm", "the batch norm was converted");
  auto [m, o] = acc.prepare(model, opt);
  for (int64_t s = 0; s < steps; ++s) {
    auto [x, y] = batch(s);
    acc.backward(nn::functional::mse_loss(m->forward(x.narrow(0, rank * rows, rows)), y.narrow(0, rank * rows, rows)));
    o->step();
    o->zero_grad();
  }
  const auto want = reference->state_dict();
  double worst = 0, moved = 0;
  const auto initial = make_model(1);
  for (const auto& [name, t] : model->state_dict()) {
    expect(want.count(name) == 1, "the converted model has the state-dict key " + name);
    if (want.count(name)) worst = std::max(worst, distance(t, want.at(name)));
  }
  for (const auto& [name, p] : initial->named_parameters()) moved = std::max(moved, distance(want.at(name), p));
  expect(model->state_dict().size() == want.size(), "the state dicts have the same keys");
  std::printf("rank %d accel: %lld steps of %lld rows per rank, max distance %.3g (training moved %.3g)\n", rank,
              (long long)steps, (long long)rows, worst, moved);
  expect(worst <= kTolerance, "parameters and running statistics match one process on the whole batches");
  expect(moved > 1e-3, "training moved the parameters");
  acc.wait_for_everyone();
  if (!failed) std::printf("accel ok\n");
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "match" && argc >= 4) {
      std::vector<int64_t> rows;
      for (int i = 3; i < argc; ++i) rows.push_back(std::atoll(argv[i]));
      return run_match(std::atoll(argv[2]), rows);
    }
    if (mode == "penalty" && argc >= 4) {
      std::vector<int64_t> rows;
      for (int i = 3; i < argc; ++i) rows.push_back(std::atoll(argv[i]));
      return run_penalty(std::atoll(argv[2]), rows);
    }
    if (mode == "mismatch" && argc == 2) return run_mismatch();
    if (mode == "accel" && argc == 4) return run_accel(std::atoll(argv[2]), std::atoll(argv[3]));
    std::fprintf(stderr, "usage: syncbn_worker match <hw> <rows>... | penalty <hw> <rows>... | mismatch | "
                         "accel <steps> <rows>\n");
    return 2;
  } catch (const std::exception& e) {
    std::printf("failed: %s\n", e.what());
    return 1;
  }
}
