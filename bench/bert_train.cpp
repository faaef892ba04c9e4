// BERT training-step benchmark on random token batches, the configuration matched by
// bench/bert_train_peer.py in PyTorch. Prints one JSON line.
//
//   bert_train --config bert-mini --task mlm --threads 2 --batch 16 --seq 128 --warmup 3 --steps 10
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/progress.h"
#include "ember/ember.h"
#include "nn/models/bert.h"
#include "optim/sgd_adam.h"

using namespace ember;

namespace {
struct Args {
  int64_t layers = 4, hidden = 256, heads = 4, ffn = 1024, vocab = 30522, seq = 128, batch = 16;
  int64_t warmup = 3, steps = 10;
  int threads = 1;
  double peak_gflops_per_core = 210.0;  // f32 FMA peak of one core: the MFU denominator
  std::string task = "mlm", dtype = "f32", config = "";
  uint64_t seed = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    EMBER_CHECK(k == "--help" || i + 1 < argc, "bert_train: ", k, " needs a value");
    if (k == "--help") {
      std::printf("usage: bert_train [--config bert-mini|bert-tiny] [--layers N] [--hidden H] [--heads A] [--ffn F]\n"
                  "                  [--vocab V] [--seq S] [--batch B] [--warmup W] [--steps N] [--threads T]\n"
                  "                  [--task mlm|cls] [--dtype f32|bf16] [--seed S] [--peak-gflops G (per core, default 210)]\n");
      std::exit(0);
    }
    const std::string v = argv[++i];
    if (k == "--config") {
      EMBER_CHECK(v == "bert-mini" || v == "bert-tiny", "bert_train: unknown --config ", v);
      a.config = v;
      if (v == "bert-tiny") a.layers = 2, a.hidden = 128, a.heads = 2, a.ffn = 512;
      else a.layers = 4, a.hidden = 256, a.heads = 4, a.ffn = 1024;
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
    else EMBER_FAIL("bert_train: unknown option ", k);
  }
  EMBER_CHECK(a.task == "mlm" || a.task == "cls", "bert_train: --task must be mlm or cls, got ", a.task);
  EMBER_CHECK(a.dtype == "f32", "bert_train: --dtype ", a.dtype, " is not available yet (f32 only)");
  EMBER_CHECK(a.steps > 0 && a.warmup >= 0, "bert_train: --steps must be positive");
  return a;
}

// Multiply-add FLOPs of one training step (forward + backward = 3x forward), counting the
// GEMMs and attention products, as MFU figures conventionally do.
double step_flops(const Args& a) {
  const double t = double(a.batch * a.seq), h = double(a.hidden), f = double(a.ffn), s = double(a.seq);
  double fwd = double(a.layers) * (2 * t * (4 * h * h + 2 * h * f) + 4 * t * s * h);
  fwd += a.task == "mlm" ? 2 * t * (h * h + h * double(a.vocab)) : 2 * double(a.batch) * (h * h + 2 * h);
  return 3 * fwd;
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
    set_num_threads(a.threads);
    manual_seed(a.seed);
    nn::BertConfig cfg;
    cfg.vocab_size = a.vocab;
    cfg.hidden_size = a.hidden;
    cfg.num_hidden_layers = a.layers;
    cfg.num_attention_heads = a.heads;
    cfg.intermediate_size = a.ffn;
    cfg.max_position_embeddings = std::max<int64_t>(512, a.seq);
    cfg.hidden_dropout_prob = cfg.attention_probs_dropout_prob = 0.1;

    std::shared_ptr<nn::BertForMaskedLM> mlm;
    std::shared_ptr<nn::BertForSequenceClassification> cls;
    nn::Module* model;
    if (a.task == "mlm") {
      model = (mlm = std::make_shared<nn::BertForMaskedLM>(cfg)).get();
    } else {
      model = (cls = std::make_shared<nn::BertForSequenceClassification>(cfg)).get();
    }
    model->train();
    optim::AdamW opt(model->parameters(), {.lr = 1e-4});

    std::vector<double> times;
    ProgressBar bar("bert_train", a.warmup + a.steps);
    for (int64_t it = 0; it < a.warmup + a.steps; ++it) {
      Tensor ids = randint(1, a.vocab, {a.batch, a.seq});
      Tensor mask = ones({a.batch, a.seq}, {DType::i64});
      const auto t0 = std::chrono::steady_clock::now();
      Tensor loss;
      if (mlm) {
        // 15% of positions scored, the rest ignored, as MLM batches are
        Tensor scored = lt(rand({a.batch, a.seq}), 0.15);
        Tensor labels = where(scored, ids, full({a.batch, a.seq}, -100.0, {DType::i64}));
        loss = mlm->forward(ids, mask, Tensor(), labels).loss;
      } else {
        Tensor labels = randint(0, 2, {a.batch});
        loss = cls->forward(ids, mask, Tensor(), labels).loss;
      }
      loss.backward();
      opt.step();
      opt.zero_grad();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (it >= a.warmup) times.push_back(ms);
      bar.update(it + 1);
    }
    bar.finish();
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const double tokens_per_s = double(a.batch * a.seq) / (median / 1000.0);
    const double flops = step_flops(a);
    const double achieved = flops / (median / 1000.0);
    const double peak = a.peak_gflops_per_core * 1e9 * a.threads;
    std::printf(
        "{\"kind\": \"result\", \"framework\": \"ember\", \"task\": \"%s\", \"dtype\": \"%s\", \"layers\": %lld, "
        "\"hidden\": %lld, \"heads\": %lld, \"ffn\": %lld, \"vocab\": %lld, \"seq\": %lld, \"batch\": %lld, "
        "\"threads\": %d, \"steps\": %lld, \"median_step_ms\": %.2f, \"tokens_per_s\": %.1f, \"gflops_per_s\": %.1f, "
        "\"mfu\": %.3f, \"peak_rss_mb\": %.1f}\n",
        a.task.c_str(), a.dtype.c_str(), (long long)a.layers, (long long)a.hidden, (long long)a.heads, (long long)a.ffn,
        (long long)a.vocab, (long long)a.seq, (long long)a.batch, a.threads, (long long)a.steps, median, tokens_per_s,
        achieved / 1e9, achieved / peak, peak_rss_mb());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
