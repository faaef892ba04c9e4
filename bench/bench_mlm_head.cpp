// BERT's masked-LM decoder and loss alone, at bert-mini's shape: hidden [2048 tokens, 256] times
// the tied word embeddings [30522, 256]^T plus the decoder bias, cross-entropy over the logits
// with 15% of the tokens scored (the rest ignore_index -100), forward then backward with fresh
// gradients each time. f32, and bf16 under autocast as bert_train --dtype bf16 runs it.
//
//   BM_MlmHeadComposed  linear, then cross_entropy over the logits: the logit gradient is
//                       written by the loss's backward and reduced again for the bias gradient
//   BM_MlmHeadFused     linear_cross_entropy: the bias gradient is summed as the logit gradient
//                       is written
//   BM_MlmDecoderForward  the decoder's product with its bias alone, no gradient
//
// The "CPU" column is the main thread's CPU time, steadier than wall time on a shared machine
// when one thread runs.
#include <benchmark/benchmark.h>

#include <string>
#include <utility>

#include "bench/progress_reporter.h"
#include "ember/ember.h"

namespace {

constexpr int64_t kTokens = 2048, kHidden = 256, kVocab = 30522;

struct Head {
  ember::Tensor hidden, weight, bias, labels;
  Head() {
    hidden = (ember::randn({kTokens, kHidden}) * 0.5).detach().requires_grad_();
    weight = (ember::randn({kVocab, kHidden}) * 0.02).detach().requires_grad_();
    bias = ember::zeros({kVocab}).requires_grad_();
    const ember::Tensor ids = ember::randint(0, kVocab, {kTokens});
    const ember::Tensor ignored = ember::full({kTokens}, -100.0, {ember::DType::i64});
    labels = ember::where(ember::lt(ember::rand({kTokens}), 0.15), ids, ignored);
  }
  void clear_grads() {
    for (ember::Tensor* t : {&hidden, &weight, &bias}) t->set_grad(ember::Tensor());
  }
};

template <typename Loss>
void run_head(benchmark::State& state, const Loss& loss_of) {
  const int threads = int(state.range(0));
  const bool bf16 = state.range(1) != 0;
  ember::set_num_threads(threads);
  state.SetLabel(std::string(bf16 ? "bf16" : "f32") + " threads=" + std::to_string(threads));
  Head head;
  for (auto _ : state) {
    ember::Tensor loss;
    {
      ember::AutocastGuard autocast(ember::DeviceType::CPU, ember::DType::bf16, bf16);
      loss = loss_of(head);
    }
    loss.backward();
    benchmark::DoNotOptimize(head.bias.grad().raw_data());
    head.clear_grads();
  }
}

void BM_MlmHeadComposed(benchmark::State& state) {
  run_head(state, [](const Head& h) {
    const ember::Tensor logits = ember::linear(h.hidden, h.weight, h.bias);
    return ember::cross_entropy(logits, h.labels, -100);
  });
}

void BM_MlmHeadFused(benchmark::State& state) {
  run_head(state, [](const Head& h) {
    return ember::linear_cross_entropy(h.hidden, h.weight, h.bias, h.labels).second;  // {logits, loss}
  });
}

void BM_MlmDecoderForward(benchmark::State& state) {
  const int threads = int(state.range(0));
  const bool bf16 = state.range(1) != 0;
  ember::set_num_threads(threads);
  state.SetLabel(std::string(bf16 ? "bf16" : "f32") + " threads=" + std::to_string(threads));
  const ember::DType dtype = bf16 ? ember::DType::bf16 : ember::DType::f32;
  const ember::Tensor hidden = ember::randn({kTokens, kHidden}).to(dtype);
  const ember::Tensor weight = (ember::randn({kVocab, kHidden}) * 0.02).to(dtype);
  const ember::Tensor bias = ember::randn({kVocab}).to(dtype);
  for (auto _ : state) {
    const ember::Tensor logits = ember::linear(hidden, weight, bias);
    benchmark::DoNotOptimize(logits.raw_data());
  }
}

void shapes(benchmark::internal::Benchmark* b) {
  for (int bf16 : {0, 1})
    for (int threads : {1, 2}) b->Args({threads, bf16});
  b->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK(BM_MlmHeadComposed)->Apply(shapes);
BENCHMARK(BM_MlmHeadFused)->Apply(shapes);
BENCHMARK(BM_MlmDecoderForward)->Apply(shapes);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  bench::ProgressReporter reporter("bench_mlm_head");
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
