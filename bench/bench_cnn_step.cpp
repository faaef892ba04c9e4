// One training step (forward, cross-entropy, backward) of a small Fashion-MNIST CNN built from
// nn modules, at batch 128, f32, on 1 and 2 threads:
//
//   Conv2d(1, 32, 3, pad 1) BatchNorm2d ReLU MaxPool2d(2)      28x28 -> 14x14
//   Conv2d(32, 64, 3, pad 1) BatchNorm2d ReLU MaxPool2d(2)     14x14 -> 7x7
//   Flatten Linear(3136, 128) ReLU Linear(128, 10)
//
// The optimizer update is left out (it is the same elementwise work whatever the layers run on).
// "images/s" is the batch over the step's wall time.
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "bench/progress_reporter.h"
#include "ember/ember.h"

namespace {

using namespace ember;

constexpr int64_t kBatch = 128;

std::shared_ptr<nn::Sequential> fashion_mnist_cnn() {
  auto conv = [](int64_t in, int64_t out) {
    return std::make_shared<nn::Conv2d>(
        nn::ConvOptions{.in_channels = in, .out_channels = out, .kernel_size = {3}, .padding = 1});
  };
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      conv(1, 32), std::make_shared<nn::BatchNorm2d>(32), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::MaxPool2d>(Shape{2}), conv(32, 64), std::make_shared<nn::BatchNorm2d>(64),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(Shape{2}), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(3136, 128), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(128, 10)});
}

void cnn_train_step(benchmark::State& state) {
  set_num_threads(int(state.range(0)));
  manual_seed(0);
  auto model = fashion_mnist_cnn();
  const Tensor images = randn({kBatch, 1, 28, 28});
  std::vector<int64_t> labels(static_cast<size_t>(kBatch));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int64_t(i % 10);
  const Tensor targets = from_vector(labels, {kBatch});
  for (auto _ : state) {
    model->zero_grad();
    Tensor loss = cross_entropy(model->forward(images), targets);
    loss.backward();
    benchmark::DoNotOptimize(loss.raw_data());
  }
  state.counters["images/s"] =
      benchmark::Counter(double(kBatch), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(cnn_train_step)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  bench::ProgressReporter reporter("bench_cnn_step");
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
