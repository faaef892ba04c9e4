// BERT training-step benchmark on random token batches, the configuration matched by
// bench/bert_train_peer.py in PyTorch. Prints one JSON line.
//
//   bert_train --config bert-mini --task mlm --threads 2 --batch 16 --seq 128 --warmup 3 --steps 10
//   bert_train --device cuda --config bert-base --task mlm --dtype bf16 --batch 64 --seq 128
//
// On the CPU the MFU denominator is --peak-gflops per thread; on CUDA it is --peak-tflops, the
// GPU's dense bf16 peak (989 for an H100/H200 SXM), and the JSON line reports the caching
// allocator's peak device memory (peak_gpu_mb) in place of the process's peak RSS.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bert_bench_model.h"
#include "core/device_api.h"
#include "core/parallel_spin.h"
#include "tracking/progress.h"

using namespace ember;

namespace {
struct Args : bench::BertSizes {
  int64_t batch = 16, warmup = 3, steps = 10;
  int threads = 1;
  double peak_gflops_per_core = 210.0;  // f32 FMA peak of one core: the CPU MFU denominator
  double peak_tflops = 989.0;           // dense bf16 peak of an H100/H200 SXM: the CUDA MFU denominator
  std::string task = "mlm", dtype = "f32", config = "", device = "cpu";
  uint64_t seed = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    EMBER_CHECK(k == "--help" || i + 1 < argc, "bert_train: ", k, " needs a value");
    if (k == "--help") {
      std::printf("usage: bert_train [--config bert-mini|bert-tiny|bert-base] [--layers N] [--hidden H] [--heads A]\n"
                  "                  [--ffn F] [--vocab V] [--seq S] [--batch B] [--warmup W] [--steps N] [--threads T]\n"
                  "                  [--task mlm|cls] [--dtype f32|bf16] [--seed S] [--device cpu|cuda]\n"
                  "                  [--peak-gflops G (CPU, per thread, default 210)]\n"
                  "                  [--peak-tflops T (CUDA, dense bf16 peak of the GPU, default 989)]\n");
      std::exit(0);
    }
    const std::string v = argv[++i];
    if (k == "--config") {
      bench::apply_bert_preset(a, v, "bert_train");
      a.config = v;
    } else if (k == "--layers") a.layers = std::stoll(v);
    else if (k == "--hidden") a.hidden = std::stoll(v);
    else if (k == "--heads") a.heads = std::stoll(v);
    else if (k == "--ffn") a.ffn = std::stoll(v);
    else if (k == "--vocab") a.vocab = std::stoll(v);
    else if (k == "--seq") a.seq = std::stoll(v);
    else if (k == "--batch") a.batch = std::stoll(v);
    else if (k == "--warmup") a.warmup = std::stoll(v);
    else if (k == "--steps") a.steps = std::stoll(v);
    else if (k == "--threads") a.threads = std::stoi(v);
    else if (k == "--task") a.task = v;
    else if (k == "--dtype") a.dtype = v;
    else if (k == "--seed") a.seed = std::stoull(v);
    else if (k == "--peak-gflops") a.peak_gflops_per_core = std::stod(v);
    else if (k == "--peak-tflops") a.peak_tflops = std::stod(v);
    else if (k == "--device") a.device = v;
    else EMBER_FAIL("bert_train: unknown option ", k);
  }
  EMBER_CHECK(a.task == "mlm" || a.task == "cls", "bert_train: --task must be mlm or cls, got ", a.task);
  EMBER_CHECK(a.dtype == "f32" || a.dtype == "bf16", "bert_train: --dtype must be f32 or bf16, got ", a.dtype);
  EMBER_CHECK(a.steps > 0 && a.warmup >= 0, "bert_train: --steps must be positive");
  EMBER_CHECK(a.device == "cpu" || a.device == "cuda", "bert_train: --device must be cpu or cuda, got ", a.device);
  EMBER_CHECK(a.peak_gflops_per_core > 0 && a.peak_tflops > 0, "bert_train: --peak-gflops and --peak-tflops must be positive");
  return a;
}

// Multiply-add FLOPs of one training step, counting the GEMMs and attention products, as MFU
// figures conventionally do: the backward is twice the forward, except the masked-LM decoder's,
// whose gradient is zero on the 85% of rows that are not scored (kMlmScoredFraction): its two
// backward products count over the scored rows only, the work any implementation must do.
constexpr double kMlmScoredFraction = 0.15;
double step_flops(const Args& a) {
  const double t = double(a.batch * a.seq), h = double(a.hidden), f = double(a.ffn), s = double(a.seq);
  const double encoder = double(a.layers) * (2 * t * (4 * h * h + 2 * h * f) + 4 * t * s * h);
  if (a.task != "mlm") return 3 * (encoder + 2 * double(a.batch) * (h * h + 2 * h));
  const double decoder = 2 * t * h * double(a.vocab);
  return 3 * (encoder + 2 * t * h * h) + decoder * (1 + 2 * kMlmScoredFraction);
}

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;
}
}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    const bool on_cuda = a.device == "cuda";
    EMBER_CHECK(!on_cuda || cuda_is_available(),
                "bert_train: --device cuda needs Ember built with CUDA and a visible GPU");
    set_num_threads(a.threads);
    manual_seed(a.seed);
    bench::BertBenchModel model(bench::bert_config(a), a.task, on_cuda ? Device::cuda(0) : Device::cpu());
    optim::AdamW opt(model.module->parameters(), {.lr = 1e-4});

    std::vector<double> times;
    double first_loss = 0, last_loss = 0;
    int64_t wakeups_before = 0;  // jobs that had to wake a sleeping pool worker, from the first timed step
    ProgressBar bar("bert_train", a.warmup + a.steps);
    for (int64_t it = 0; it < a.warmup + a.steps; ++it) {
      if (it == a.warmup) wakeups_before = detail::pool_wakeups();
      const double ms = model.train_step(opt, a.batch, a.seq, a.vocab, a.dtype == "bf16", &last_loss);
      if (it == 0) first_loss = last_loss;
      if (it >= a.warmup) times.push_back(ms);
      char post[96];
      std::snprintf(post, sizeof post, "loss %.3f | %.0f tok/s", last_loss, double(a.batch * a.seq) / (ms / 1000.0));
      bar.update(it + 1, post);
    }
    bar.finish();
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const double tokens_per_s = double(a.batch * a.seq) / (median / 1000.0);
    const double flops = step_flops(a);
    const double achieved = flops / (median / 1000.0);
    if (!on_cuda) {
      const double peak = a.peak_gflops_per_core * 1e9 * a.threads;
      std::printf(
          "{\"kind\": \"result\", \"framework\": \"ember\", \"task\": \"%s\", \"dtype\": \"%s\", \"layers\": %lld, "
          "\"hidden\": %lld, \"heads\": %lld, \"ffn\": %lld, \"vocab\": %lld, \"seq\": %lld, \"batch\": %lld, "
          "\"threads\": %d, \"steps\": %lld, \"median_step_ms\": %.2f, \"tokens_per_s\": %.1f, \"gflops_per_s\": %.1f, "
          "\"mfu\": %.3f, \"peak_rss_mb\": %.1f, \"pool_wakeups_per_step\": %.1f}\n",
          a.task.c_str(), a.dtype.c_str(), (long long)a.layers, (long long)a.hidden, (long long)a.heads,
          (long long)a.ffn, (long long)a.vocab, (long long)a.seq, (long long)a.batch, a.threads, (long long)a.steps,
          median, tokens_per_s, achieved / 1e9, achieved / peak, peak_rss_mb(),
          double(detail::pool_wakeups() - wakeups_before) / double(a.steps));
      return 0;
    }
    // CUDA: the same fields, plus the device, the step-time spread, the losses as a sanity check,
    // the peak the MFU is taken against, and the allocator's peak device memory instead of RSS.
    const double peak = a.peak_tflops * 1e12;
    const double peak_gpu_mb = double(cuda_memory_stats(0).peak_bytes_in_use) / (1024.0 * 1024.0);
    std::printf(
        "{\"kind\": \"result\", \"framework\": \"ember\", \"device\": \"cuda\", \"config\": \"%s\", "
        "\"task\": \"%s\", \"dtype\": \"%s\", \"layers\": %lld, \"hidden\": %lld, \"heads\": %lld, \"ffn\": %lld, "
        "\"vocab\": %lld, \"seq\": %lld, \"batch\": %lld, \"threads\": %d, \"steps\": %lld, "
        "\"median_step_ms\": %.2f, \"min_step_ms\": %.2f, \"max_step_ms\": %.2f, \"tokens_per_s\": %.1f, "
        "\"gflops_per_s\": %.1f, \"tflops_per_s\": %.2f, \"peak_tflops\": %.1f, \"mfu\": %.3f, "
        "\"peak_gpu_mb\": %.1f, \"first_loss\": %.4f, \"last_loss\": %.4f}\n",
        a.config.c_str(), a.task.c_str(), a.dtype.c_str(), (long long)a.layers, (long long)a.hidden,
        (long long)a.heads, (long long)a.ffn, (long long)a.vocab, (long long)a.seq, (long long)a.batch, a.threads,
        (long long)a.steps, median, times.front(), times.back(), tokens_per_s, achieved / 1e9, achieved / 1e12,
        a.peak_tflops, achieved / peak, peak_gpu_mb, first_loss, last_loss);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
