// Memory-bound ops at training sizes. "GB/s" counts the bytes an ideal kernel must move (each
// input read once, each output written once, f32), so it reads directly against the machine's
// memory/cache bandwidth. Times are wall-clock; each op runs at 1 and 2 threads.
//
//   BM_Softmax              softmax over the last dim of [64, 128, 128]     read x, write y
//   BM_ScaledMaskedSoftmax  attention scores: softmax(x / 8 + mask) over the last dim of
//                           [16, 4, 128, 128] with a [16, 1, 1, 128] padding mask    read x, write y
//   BM_SoftmaxFwdBwd        BM_Softmax's softmax, forward then backward    read x, write y;
//                           read dy and y, write dx
//   BM_ScaledMaskedSoftmaxFwdBwd  BM_ScaledMaskedSoftmax's, forward then backward (which
//                           recomputes y from x)    read x, write y; read dy and x, write dx
//   BM_LogSoftmaxFwdBwd     log_softmax over the last dim of [512, 2048] (a classifier's
//                           logits, as cross-entropy takes them), forward then backward    read
//                           x, write y; read dy and y, write dx
//   BM_LayerNormFwdBwd      layer_norm over 256 of [2048, 256], with weight and bias, forward
//                           then backward    read x, write y; read dy (and x), write dx
//   BM_AddLayerNormFwdBwd   add_layer_norm (x + residual, then BM_LayerNormFwdBwd's layer norm),
//                           forward then backward    read x and residual, write h and y; read
//                           dy and h, write dx (dresidual is the same tensor)
//   BM_BatchNormFwdBwd      batch_norm in training of [128, 64, 14, 14], with weight, bias and
//                           running statistics, forward then backward    as layer norm
//   BM_GroupNormFwdBwd      group_norm, 32 groups, of [16, 256, 256], forward then backward
//   BM_RmsNormFwdBwd        rms_norm over 1024 of [2048, 1024], with weight, forward then backward
//   BM_Gelu                 exact gelu over 4M elements                     read x, write y
//   BM_GeluTanh             tanh-form gelu over 4M elements                 read x, write y
//   BM_Dropout              dropout, p = 0.1, training, over 4M elements    read x, write y and
//                           the one-byte keep mask
//   BM_Randn                normal fill of 4M f32 elements (model initialisation)    write y
//   BM_CastToBf16           f32 to bf16 conversion of 4M elements           read f32, write bf16
//   BM_BroadcastAdd         [2048, 1024] + [1024]                           read both, write y
//   BM_MaxPool2dFwdBwd      max_pool2d 2x2 of [128, 32, 28, 28], forward then backward
//                           read x, write y and i64 indices; read dy and indices, write dx
//   BM_AdaptiveAvgPool2dFwdBwd  adaptive_avg_pool2d of [128, 32, 28, 28] to 14x14 (2x2
//                           windows), forward then backward   read x, write y; read dy, write dx
//   BM_AvgPool2dFwdBwd      avg_pool2d 2x2 of [128, 32, 28, 28], forward then backward    as
//                           BM_AdaptiveAvgPool2dFwdBwd
//   BM_GlobalAvgPool2dFwdBwd  adaptive_avg_pool2d of [128, 512, 7, 7] to 1x1 (a ResNet's last
//                           pool), forward then backward    as BM_AdaptiveAvgPool2dFwdBwd
//   BM_AdamW                AdamW step (weight decay 0.01) of one dense 4M-element f32 parameter
//                           read param, grad, exp_avg and exp_avg_sq; write param, exp_avg and
//                           exp_avg_sq (the states exist: the first step runs before timing)
//   BM_EmbeddingBwdAdamW    BERT-mini's word embeddings (30522 x 256, padding row 0): lookup of
//                           16 x 128 ids, backward, AdamW step (weight decay 0.01), zero_grad;
//                           rows=0 the dense gradient table, rows=1 row_sparse_backward (the
//                           same weights). GB/s counts the step's read and write of weight,
//                           exp_avg and exp_avg_sq
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "bench/progress_reporter.h"
#include "ember/ember.h"

namespace {

void use_threads(benchmark::State& state) {
  const int threads = int(state.range(0));
  ember::set_num_threads(threads);
  state.SetLabel("threads=" + std::to_string(threads));
}

void count_bytes(benchmark::State& state, double bytes) {
  state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

constexpr double kF32 = 4.0;

void BM_Softmax(benchmark::State& state) {
  use_threads(state);
  const ember::Tensor x = ember::randn({64, 128, 128});
  for (auto _ : state) {
    ember::Tensor y = ember::softmax(x, -1);
    benchmark::DoNotOptimize(y.raw_data());
  }
  count_bytes(state, 2.0 * double(x.numel()) * kF32);
}

void BM_ScaledMaskedSoftmax(benchmark::State& state) {
  use_threads(state);
  const ember::Tensor x = ember::randn({16, 4, 128, 128});
  ember::Tensor mask = ember::zeros({16, 1, 1, 128});
  mask.narrow(3, 100, 28).fill_(-1e4);  // padded tail of every sequence
  for (auto _ : state) {
    ember::Tensor y = ember::scaled_masked_softmax(x, mask, 0.125);
    benchmark::DoNotOptimize(y.raw_data());
  }
  count_bytes(state, 2.0 * double(x.numel()) * kF32);
}

void BM_LayerNormFwdBwd(benchmark::State& state) {
  use_threads(state);
  ember::Tensor x = ember::randn({2048, 256}).requires_grad_();
  ember::Tensor w = ember::ones({256}).requires_grad_();
  ember::Tensor b = ember::zeros({256}).requires_grad_();
  const ember::Tensor dy = ember::randn({2048, 256});
  for (auto _ : state) {
    ember::Tensor y = ember::layer_norm(x, {256}, w, b);
    y.backward(dy);
    benchmark::DoNotOptimize(x.grad().raw_data());
    // fresh gradients each time, so accumulation is not part of what is timed
    x.set_grad(ember::Tensor());
    w.set_grad(ember::Tensor());
    b.set_grad(ember::Tensor());
  }
  // forward: read x, write y; backward: read dy and x, write dx (per-row statistics and the
  // 256-element parameters are noise at this size)
  count_bytes(state, 5.0 * double(x.numel()) * kF32);
}

void BM_AddLayerNormFwdBwd(benchmark::State& state) {
  use_threads(state);
  ember::Tensor x = ember::randn({2048, 256}).requires_grad_();
  ember::Tensor residual = ember::randn({2048, 256}).requires_grad_();
  ember::Tensor w = ember::ones({256}).requires_grad_();
  ember::Tensor b = ember::zeros({256}).requires_grad_();
  const ember::Tensor dy = ember::randn({2048, 256});
  for (auto _ : state) {
    ember::Tensor y = ember::add_layer_norm(x, residual, {256}, w, b);
    y.backward(dy);
    benchmark::DoNotOptimize(x.grad().raw_data());
    for (ember::Tensor t : {x, residual, w, b}) t.set_grad(ember::Tensor());
  }
  count_bytes(state, 7.0 * double(x.numel()) * kF32);
}

// Times forward then backward of `forward` at x, with fresh gradients each time; counts the
// bytes of layer norm's (read x, write y; read dy and x, write dx), which softmax's equal.
template <typename Forward>
void run_norm_fwd_bwd(benchmark::State& state, ember::Tensor x, const std::vector<ember::Tensor>& params,
                      const Forward& forward) {
  x.requires_grad_();
  const ember::Tensor dy = ember::randn(x.shape());
  for (auto _ : state) {
    forward(x).backward(dy);
    benchmark::DoNotOptimize(x.grad().raw_data());
    x.set_grad(ember::Tensor());
    for (ember::Tensor p : params) p.set_grad(ember::Tensor());
  }
  count_bytes(state, 5.0 * double(x.numel()) * kF32);
}

void BM_SoftmaxFwdBwd(benchmark::State& state) {
  use_threads(state);
  const ember::Tensor x = ember::randn({64, 128, 128});
  run_norm_fwd_bwd(state, x, {}, [](const ember::Tensor& t) { return ember::softmax(t, -1); });
}

void BM_ScaledMaskedSoftmaxFwdBwd(benchmark::State& state) {
  use_threads(state);
  const ember::Tensor x = ember::randn({16, 4, 128, 128});
  ember::Tensor mask = ember::zeros({16, 1, 1, 128});
  mask.narrow(3, 100, 28).fill_(-1e4);
  run_norm_fwd_bwd(state, x, {}, [&](const ember::Tensor& t) { return ember::scaled_masked_softmax(t, mask, 0.125); });
}

void BM_LogSoftmaxFwdBwd(benchmark::State& state) {
  use_threads(state);
  const ember::Tensor x = ember::randn({512, 2048});
  run_norm_fwd_bwd(state, x, {}, [](const ember::Tensor& t) { return ember::log_softmax(t, -1); });
}

void BM_BatchNormFwdBwd(benchmark::State& state) {
  use_threads(state);
  ember::Tensor w = ember::ones({64}).requires_grad_(), b = ember::zeros({64}).requires_grad_();
  ember::Tensor running_mean = ember::zeros({64}), running_var = ember::ones({64});
  run_norm_fwd_bwd(state, ember::randn({128, 64, 14, 14}), {w, b}, [&](const ember::Tensor& x) {
    return ember::batch_norm(x, running_mean, running_var, w, b, true);
  });
}

void BM_GroupNormFwdBwd(benchmark::State& state) {
  use_threads(state);
  ember::Tensor w = ember::ones({256}).requires_grad_(), b = ember::zeros({256}).requires_grad_();
  run_norm_fwd_bwd(state, ember::randn({16, 256, 256}), {w, b},
                   [&](const ember::Tensor& x) { return ember::group_norm(x, 32, w, b); });
}

void BM_RmsNormFwdBwd(benchmark::State& state) {
  use_threads(state);
  ember::Tensor w = ember::ones({1024}).requires_grad_();
  run_norm_fwd_bwd(state, ember::randn({2048, 1024}), {w},
                   [&](const ember::Tensor& x) { return ember::rms_norm(x, {1024}, w); });
}

// Times op over 4M f32 elements, counting bytes_per_element for each.
template <typename Op>
void over_4m_elements(benchmark::State& state, double bytes_per_element, const Op& op) {
  use_threads(state);
  const ember::Tensor x = ember::randn({4 << 20});
  for (auto _ : state) {
    ember::Tensor y = op(x);
    benchmark::DoNotOptimize(y.raw_data());
  }
  count_bytes(state, bytes_per_element * double(x.numel()));
}

void BM_Gelu(benchmark::State& state) {
  over_4m_elements(state, 2.0 * kF32, [](const ember::Tensor& x) { return ember::gelu(x); });
}

void BM_GeluTanh(benchmark::State& state) {
  over_4m_elements(state, 2.0 * kF32, [](const ember::Tensor& x) { return ember::gelu(x, true); });
}

void BM_Dropout(benchmark::State& state) {
  // x, y and the one-byte keep mask
  over_4m_elements(state, 2.0 * kF32 + 1.0, [](const ember::Tensor& x) { return ember::dropout(x, 0.1, true); });
}

void BM_Randn(benchmark::State& state) {
  over_4m_elements(state, kF32, [](const ember::Tensor&) { return ember::randn({4 << 20}); });
}

void BM_CastToBf16(benchmark::State& state) {
  over_4m_elements(state, kF32 + 2.0, [](const ember::Tensor& x) { return x.to(ember::DType::bf16); });
}

void BM_BroadcastAdd(benchmark::State& state) {
  use_threads(state);
  const ember::Tensor a = ember::randn({2048, 1024}), b = ember::randn({1024});
  for (auto _ : state) {
    ember::Tensor y = a + b;
    benchmark::DoNotOptimize(y.raw_data());
  }
  count_bytes(state, (2.0 * double(a.numel()) + double(b.numel())) * kF32);
}

// A CNN-sized pooling layer of x [128, 32, 28, 28] (or `in`) to dy's [128, 32, 14, 14] (or
// `out`), forward then backward, moving `bytes_per_input` f32 words per element of x.
template <typename Pool>
void pool_forward_backward(benchmark::State& state, const Pool& pool, double bytes_per_input,
                           const ember::Shape& in = {128, 32, 28, 28}, const ember::Shape& out = {128, 32, 14, 14}) {
  use_threads(state);
  ember::Tensor x = ember::randn(in).requires_grad_();
  const ember::Tensor dy = ember::randn(out);
  for (auto _ : state) {
    ember::Tensor y = pool(x);
    y.backward(dy);
    benchmark::DoNotOptimize(x.grad().raw_data());
    x.set_grad(ember::Tensor());
  }
  count_bytes(state, bytes_per_input * double(x.numel()) * kF32);
}

void BM_MaxPool2dFwdBwd(benchmark::State& state) {
  // x + y/4 + indices/4 (i64: twice an f32), then dy/4 + indices/4 + dx
  pool_forward_backward(state, [](const ember::Tensor& x) { return ember::max_pool2d(x, {2}); }, 3.5);
}

void BM_AdaptiveAvgPool2dFwdBwd(benchmark::State& state) {
  // x + y/4, then dy/4 + dx
  pool_forward_backward(state, [](const ember::Tensor& x) { return ember::adaptive_avg_pool2d(x, {14}); }, 2.5);
}

void BM_AvgPool2dFwdBwd(benchmark::State& state) {
  // x + y/4, then dy/4 + dx
  pool_forward_backward(state, [](const ember::Tensor& x) { return ember::avg_pool2d(x, {2}); }, 2.5);
}

void BM_GlobalAvgPool2dFwdBwd(benchmark::State& state) {
  // x + y/49, then dy/49 + dx
  pool_forward_backward(state, [](const ember::Tensor& x) { return ember::adaptive_avg_pool2d(x, {1}); },
                        2.0 + 2.0 / 49.0, {128, 512, 7, 7}, {128, 512, 1, 1});
}

void BM_AdamW(benchmark::State& state) {
  use_threads(state);
  ember::Tensor w = ember::randn({4 << 20}).requires_grad_();
  w.set_grad(ember::randn({4 << 20}));
  ember::optim::AdamW opt({w}, {.lr = 1e-4, .weight_decay = 0.01});
  opt.step();  // allocates exp_avg and exp_avg_sq
  for (auto _ : state) {
    opt.step();
    benchmark::DoNotOptimize(w.raw_data());
  }
  count_bytes(state, 7.0 * double(w.numel()) * kF32);
}

void BM_EmbeddingBwdAdamW(benchmark::State& state) {
  use_threads(state);
  ember::manual_seed(0);
  auto table = std::make_shared<ember::nn::Embedding>(30522, 256, 0);
  table->row_sparse_backward = state.range(1) != 0;
  ember::optim::AdamW opt(table->parameters(), {.lr = 1e-4, .weight_decay = 0.01});
  const ember::Tensor ids = ember::randint(0, 30522, {16, 128});
  const ember::Tensor dy = ember::randn({16, 128, 256});
  for (auto _ : state) {
    table->forward(ids).backward(dy);
    opt.step();
    opt.zero_grad();
  }
  count_bytes(state, 6.0 * double(table->weight.numel()) * kF32);
}

void threads(benchmark::internal::Benchmark* b) {
  b->Arg(1)->Arg(2)->ArgName("threads")->UseRealTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK(BM_Softmax)->Apply(threads);
BENCHMARK(BM_ScaledMaskedSoftmax)->Apply(threads);
BENCHMARK(BM_SoftmaxFwdBwd)->Apply(threads);
BENCHMARK(BM_ScaledMaskedSoftmaxFwdBwd)->Apply(threads);
BENCHMARK(BM_LogSoftmaxFwdBwd)->Apply(threads);
BENCHMARK(BM_LayerNormFwdBwd)->Apply(threads);
BENCHMARK(BM_AddLayerNormFwdBwd)->Apply(threads);
BENCHMARK(BM_BatchNormFwdBwd)->Apply(threads);
BENCHMARK(BM_GroupNormFwdBwd)->Apply(threads);
BENCHMARK(BM_RmsNormFwdBwd)->Apply(threads);
BENCHMARK(BM_Gelu)->Apply(threads);
BENCHMARK(BM_GeluTanh)->Apply(threads);
BENCHMARK(BM_Dropout)->Apply(threads);
BENCHMARK(BM_Randn)->Apply(threads);
BENCHMARK(BM_CastToBf16)->Apply(threads);
BENCHMARK(BM_BroadcastAdd)->Apply(threads);
BENCHMARK(BM_MaxPool2dFwdBwd)->Apply(threads);
BENCHMARK(BM_AdaptiveAvgPool2dFwdBwd)->Apply(threads);
BENCHMARK(BM_AvgPool2dFwdBwd)->Apply(threads);
BENCHMARK(BM_GlobalAvgPool2dFwdBwd)->Apply(threads);
BENCHMARK(BM_AdamW)->Apply(threads);
BENCHMARK(BM_EmbeddingBwdAdamW)
    ->ArgsProduct({{1, 2}, {0, 1}})
    ->ArgNames({"threads", "rows"})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  bench::ProgressReporter reporter("bench_ops");
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
