// The main job: pretrain a BERT-mini with masked-LM on English text (WikiText-2 + Gutenberg),
// save it in the Hugging Face format, fine-tune it on SST-2 and report dev accuracy per epoch.
//
//   bert_sst2 [--stage all|pretrain|finetune] [--pretrain-steps N] [--epochs N] [--threads T] ...
// Progress goes to stderr. The run is logged with the experiment trackers the Accelerator uses,
// into <out>: config.json (the options), metrics.jsonl (appended to: a later run, say
// --stage finetune, continues it), TensorBoard events and, at the end, report.html, the page
// `ember plot <out>` draws. Each stage has its own metric names and counts its own steps:
//   pretrain/loss, pretrain/loss_ema, pretrain/lr, pretrain/tokens_per_s   at pretraining steps
//   finetune/loss, finetune/loss_ema, finetune/lr                           at fine-tuning steps
//   finetune/dev_accuracy                       at the fine-tuning step that ends each epoch
// so every chart is one stage's curve, and the dev accuracy lines up with the loss it follows.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "data/dataloader.h"
#include "data/length_grouped_sampler.h"
#include "data/mlm_collator.h"
#include "data/text_datasets.h"
#include "ember/ember.h"
#include "nn/models/bert.h"
#include "nn/models/pretrained.h"
#include "optim/clip_grad.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd_adam.h"
#include "tracking/plot/html_report.h"
#include "tracking/plot/run_metrics.h"
#include "tracking/progress.h"
#include "tracking/tracker_group.h"

using namespace ember;
using tracking::TrackerConfig;
using tracking::TrackerGroup;

namespace {

struct Args {
  std::string stage = "all";
  std::string data_dir = std::string(EMBER_SOURCE_DIR) + "/datasets";
  std::string out = "runs/bert_sst2";
  int threads = 0;
  uint64_t seed = 0;
  // pretraining
  int64_t pretrain_steps = 800;  // masked-LM steps before fine-tuning (0: fine-tune from scratch)
  int64_t pretrain_batch = 32;
  int64_t seq_len = 128;
  double pretrain_lr = 1e-3;
  // fine-tuning
  int64_t epochs = 1;
  int64_t batch = 32;
  int64_t max_len = 66;
  double lr = 2e-4;
  int64_t eval_batch = 128;
  int64_t train_limit = -1;  // use only the first N training phrases (quick checks)
  int64_t eval_limit = -1;   // evaluate on the first N dev sentences only (quick checks)
  int num_workers = 1;
  bool group_by_length = true;  // batches of similar-length phrases: far less padding
  std::string mixed_precision = "no";  // "bf16": forward passes and losses under bf16 autocast
  int64_t log_every = 50;  // training-loss rows every N steps, and at the end of each epoch/stage
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      EMBER_CHECK(i + 1 < argc, "bert_sst2: ", k, " needs a value");
      return argv[++i];
    };
    if (k == "--stage") a.stage = val();
    else if (k == "--data-dir") a.data_dir = val();
    else if (k == "--out") a.out = val();
    else if (k == "--threads") a.threads = std::stoi(val());
    else if (k == "--seed") a.seed = std::stoull(val());
    else if (k == "--pretrain-steps") a.pretrain_steps = std::stoll(val());
    else if (k == "--pretrain-batch") a.pretrain_batch = std::stoll(val());
    else if (k == "--seq-len") a.seq_len = std::stoll(val());
    else if (k == "--pretrain-lr") a.pretrain_lr = std::stod(val());
    else if (k == "--epochs") a.epochs = std::stoll(val());
    else if (k == "--batch") a.batch = std::stoll(val());
    else if (k == "--max-len") a.max_len = std::stoll(val());
    else if (k == "--lr") a.lr = std::stod(val());
    else if (k == "--workers") a.num_workers = std::stoi(val());
    else if (k == "--train-limit") a.train_limit = std::stoll(val());
    else if (k == "--eval-limit") a.eval_limit = std::stoll(val());
    else if (k == "--group-by-length") a.group_by_length = std::stoi(val()) != 0;
    else if (k == "--mixed-precision") a.mixed_precision = val();
    else if (k == "--log-every") a.log_every = std::stoll(val());
    else if (k == "--help" || k == "-h") {
      std::printf(
          "usage: bert_sst2 [--stage all|pretrain|finetune] [--data-dir D] [--out DIR] [--threads T] [--seed S]\n"
          "                 [--pretrain-steps N] [--pretrain-batch B] [--seq-len L] [--pretrain-lr X]\n"
          "                 [--epochs N] [--batch B] [--max-len L] [--lr X] [--workers W] [--train-limit N]\n"
          "                 [--eval-limit N] [--group-by-length 0|1] [--mixed-precision no|bf16] [--log-every N]\n"
          "\n"
          "Pretrains a BERT-mini with masked-LM (--pretrain-steps steps; 0 skips it), then fine-tunes it\n"
          "on SST-2 (--epochs epochs over the first --train-limit phrases, all by default) and reports\n"
          "the dev accuracy after each epoch (on the first --eval-limit dev sentences, all by\n"
          "default; the limits are for quick checks). The run is logged in --out (default runs/bert_sst2):\n"
          "config.json, metrics.jsonl (appended to), TensorBoard events and report.html; draw it\n"
          "again with `ember plot <out>`. The training loss is logged every --log-every steps\n"
          "(default 50) and at the end of each epoch; metric names start with the stage\n"
          "(pretrain/loss, finetune/loss, finetune/dev_accuracy), and each stage counts its own steps.\n");
      std::exit(0);
    } else {
      EMBER_FAIL("bert_sst2: unknown option ", k, " (see --help)");
    }
  }
  EMBER_CHECK(a.stage == "all" || a.stage == "pretrain" || a.stage == "finetune",
              "bert_sst2: --stage must be all, pretrain or finetune, got ", a.stage);
  EMBER_CHECK(a.mixed_precision == "no" || a.mixed_precision == "bf16",
              "bert_sst2: --mixed-precision must be no or bf16, got ", a.mixed_precision);
  EMBER_CHECK(a.log_every >= 1, "bert_sst2: --log-every must be at least 1, got ", a.log_every);
  return a;
}

// The run's config.json: every option as given, and the number of threads used.
TrackerConfig run_config(const Args& a) {
  return {{"stage", a.stage},
          {"data_dir", a.data_dir},
          {"out", a.out},
          {"threads", get_num_threads()},
          {"seed", a.seed},
          {"pretrain_steps", a.pretrain_steps},
          {"pretrain_batch", a.pretrain_batch},
          {"seq_len", a.seq_len},
          {"pretrain_lr", a.pretrain_lr},
          {"epochs", a.epochs},
          {"batch", a.batch},
          {"max_len", a.max_len},
          {"lr", a.lr},
          {"eval_batch", a.eval_batch},
          {"train_limit", a.train_limit},
          {"eval_limit", a.eval_limit},
          {"workers", a.num_workers},
          {"group_by_length", a.group_by_length},
          {"mixed_precision", a.mixed_precision},
          {"log_every", a.log_every}};
}

// Rows appended to a metrics.jsonl that `ember plot` cannot read (one written by an older
// bert_sst2 in its own format, say) would make a run that cannot be plotted: refuse it before
// training rather than after.
void check_appendable(const std::string& out) {
  if (!plot::is_run_dir(out)) return;
  try {
    plot::read_run(out);
  } catch (const Error& e) {
    EMBER_FAIL("bert_sst2: cannot append to ", out, "/metrics.jsonl (", e.what(),
               "); move it away or choose another --out");
  }
}

// The autocast scope of one forward pass: bf16 products with f32 weights, or nothing.
AutocastGuard forward_precision(const Args& a) {
  return AutocastGuard(DeviceType::CPU, DType::bf16, a.mixed_precision == "bf16");
}

std::vector<std::string> corpus_files(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir + "/corpus"))
    if (entry.is_regular_file()) files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  EMBER_CHECK(!files.empty(), "bert_sst2: no corpus files under ", dir, "/corpus");
  return files;
}

void pretrain(const Args& a, const data::WordPieceTokenizer& tok, TrackerGroup& log) {
  auto corpus = std::make_shared<data::PackedTextDataset>(tok, corpus_files(a.data_dir), a.seq_len);
  std::printf("pretrain: %lld sequences of %lld tokens (%lld tokens)\n", (long long)corpus->size(),
              (long long)a.seq_len, (long long)corpus->num_tokens());
  data::MLMCollator collator({.vocab_size = tok.vocab_size(), .mask_token_id = tok.mask_id(),
                              .pad_token_id = tok.pad_id(), .special_token_ids = tok.special_ids(), .seed = a.seed});
  data::DataLoader loader(corpus, {.batch_size = a.pretrain_batch, .shuffle = true, .drop_last = true,
                                   .num_workers = a.num_workers, .seed = a.seed,
                                   .collate = [&](const auto& ex, const auto& ctx) { return collator(ex, ctx); }});

  nn::BertConfig cfg = nn::BertConfig::mini(tok.vocab_size());
  cfg.max_position_embeddings = std::max<int64_t>(a.seq_len, 128);
  auto model = std::make_shared<nn::BertForMaskedLM>(cfg);
  model->sparse_prediction = true;  // score only the masked positions: same loss, less work
  model->train();
  optim::AdamW opt(model->parameters(), {.lr = a.pretrain_lr, .weight_decay = 0.01});
  auto sched = optim::get_scheduler("linear", opt, a.pretrain_steps / 10, a.pretrain_steps);

  ProgressBar bar("pretrain", a.pretrain_steps);
  int64_t step = 0, epoch = 0, tokens = 0;
  double ema = 0.0;
  while (step < a.pretrain_steps) {
    loader.set_epoch(epoch++);
    for (auto& batch : loader) {
      auto out = [&] {
        auto autocast = forward_precision(a);
        return model->forward(batch);
      }();
      out.loss.backward();
      optim::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();
      sched->step();
      opt.zero_grad();
      ++step;
      tokens += batch.at("input_ids").numel();
      const double loss = out.loss.item<double>();
      ema = step == 1 ? loss : 0.98 * ema + 0.02 * loss;
      char post[128];
      std::snprintf(post, sizeof post, "loss %.3f | %.0f tok/s", ema, double(tokens) / bar.elapsed_seconds());
      bar.update(step, post);
      if (step % a.log_every == 0 || step == a.pretrain_steps)
        log.log({{"pretrain/loss", loss}, {"pretrain/loss_ema", ema}, {"pretrain/lr", sched->get_last_lr()[0]},
                 {"pretrain/tokens_per_s", double(tokens) / bar.elapsed_seconds()}},
                step);
      if (step >= a.pretrain_steps) break;
    }
  }
  bar.finish();
  nn::save_pretrained(*model, cfg, a.out + "/pretrained", "BertForMaskedLM");
  std::printf("pretrain: final loss (EMA) %.3f, saved to %s/pretrained\n", ema, a.out.c_str());
}

double evaluate(const Args& a, nn::BertForSequenceClassification& model, data::DataLoader& loader) {
  NoGradGuard ng;
  auto autocast = forward_precision(a);
  model.eval();
  int64_t correct = 0, total = 0, batches = 0;
  ProgressBar bar("evaluate", loader.size(), "batch");
  for (auto& batch : loader) {
    auto out = model.forward(batch);
    Tensor pred = argmax(out.logits, -1);
    correct += sum(eq(pred, batch.at("labels"))).item<int64_t>();
    total += batch.size();
    char post[48];
    std::snprintf(post, sizeof post, "accuracy %.2f%%", 100.0 * double(correct) / double(total));
    bar.update(++batches, post);
  }
  bar.finish();
  model.train();
  return total ? double(correct) / double(total) : 0.0;
}

double finetune(const Args& a, const data::WordPieceTokenizer& tok, TrackerGroup& log, bool use_checkpoint) {
  auto train_texts = data::read_labeled_tsv(a.data_dir + "/sst2/train.tsv.gz");
  if (a.train_limit >= 0 && a.train_limit < train_texts.size()) {
    train_texts.texts.resize(size_t(a.train_limit));
    train_texts.labels.resize(size_t(a.train_limit));
  }
  auto dev_texts = data::read_labeled_tsv(a.data_dir + "/sst2/dev.tsv.gz");
  if (a.eval_limit >= 0 && a.eval_limit < dev_texts.size()) {
    dev_texts.texts.resize(size_t(a.eval_limit));
    dev_texts.labels.resize(size_t(a.eval_limit));
  }
  auto train = std::make_shared<data::TextClassificationDataset>(tok, train_texts, a.max_len);
  auto dev = std::make_shared<data::TextClassificationDataset>(tok, dev_texts, 128);
  std::printf("finetune: %lld training phrases, %lld dev sentences\n", (long long)train->size(), (long long)dev->size());
  data::PadCollate pad;
  auto collate = [&](const auto& ex, const auto& ctx) { return pad(ex, ctx); };
  std::shared_ptr<const data::Sampler> order;
  if (a.group_by_length)
    order = std::make_shared<data::LengthGroupedSampler>(train->lengths(), a.batch, a.seed);
  else
    order = std::make_shared<data::RandomSampler>(train->size(), a.seed);
  data::DataLoader train_loader(train, order, {.batch_size = a.batch, .num_workers = a.num_workers, .collate = collate});
  data::DataLoader dev_loader(dev, {.batch_size = a.eval_batch, .collate = collate});

  std::shared_ptr<nn::BertForSequenceClassification> model;
  if (use_checkpoint && std::filesystem::exists(a.out + "/pretrained/model.safetensors")) {
    model = nn::from_pretrained<nn::BertForSequenceClassification>(a.out + "/pretrained");
    std::printf("finetune: starting from %s/pretrained\n", a.out.c_str());
  } else {
    model = std::make_shared<nn::BertForSequenceClassification>(nn::BertConfig::mini(tok.vocab_size()));
    std::printf("finetune: starting from random weights\n");
  }
  model->train();
  optim::AdamW opt(model->parameters(), {.lr = a.lr, .weight_decay = 0.01});
  const int64_t total_steps = a.epochs * train_loader.size();
  auto sched = optim::get_scheduler("linear", opt, total_steps / 10, total_steps);

  double best = 0.0;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < a.epochs; ++epoch) {
    train_loader.set_epoch(epoch);
    ProgressBar bar("finetune epoch " + std::to_string(epoch + 1), train_loader.size(), "batch");
    double ema = 0.0;
    int64_t local = 0, examples = 0;
    for (auto& batch : train_loader) {
      auto out = [&] {
        auto autocast = forward_precision(a);
        return model->forward(batch);
      }();
      out.loss.backward();
      optim::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();
      sched->step();
      opt.zero_grad();
      ++step;
      ++local;
      examples += batch.size();
      const double loss = out.loss.item<double>();
      ema = local == 1 ? loss : 0.98 * ema + 0.02 * loss;
      char post[128];
      std::snprintf(post, sizeof post, "loss %.3f | %.0f ex/s", ema, double(examples) / bar.elapsed_seconds());
      bar.update(local, post);
      if (step % a.log_every == 0 || local == train_loader.size())
        log.log({{"finetune/loss", loss}, {"finetune/loss_ema", ema}, {"finetune/lr", sched->get_last_lr()[0]}}, step);
    }
    bar.finish();
    const double acc = evaluate(a, *model, dev_loader);
    best = std::max(best, acc);
    std::printf("epoch %lld: train loss (EMA) %.4f, SST-2 dev accuracy %.2f%%\n", (long long)(epoch + 1), ema, acc * 100);
    std::fflush(stdout);
    log.log({{"finetune/dev_accuracy", acc}}, step);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    if (a.threads > 0) set_num_threads(a.threads);
    manual_seed(a.seed);
    check_appendable(a.out);
    TrackerGroup log({"jsonl", "tensorboard"});
    log.start_in(a.out, run_config(a));
    auto tok = data::WordPieceTokenizer::from_file(a.data_dir + "/vocab/bert-base-uncased-vocab.txt.gz");
    const auto t0 = std::chrono::steady_clock::now();
    if ((a.stage == "all" && a.pretrain_steps > 0) || a.stage == "pretrain") pretrain(a, tok, log);
    double acc = -1;
    // "all" fine-tunes what it just pretrained (or random weights with --pretrain-steps 0);
    // "finetune" alone starts from an earlier run's checkpoint when there is one.
    if (a.stage == "all") acc = finetune(a, tok, log, a.pretrain_steps > 0);
    if (a.stage == "finetune") acc = finetune(a, tok, log, true);
    const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 60;
    if (acc >= 0) std::printf("final: SST-2 dev accuracy %.2f%% (best epoch), wall time %.1f min\n", acc * 100, minutes);
    // The curves of everything metrics.jsonl holds (earlier stages' runs included), as
    // `ember plot <out>` draws them.
    const bool logged = log.log_calls() > 0;
    log.finish();
    if (logged) plot::write_html_report({a.out}, a.out + "/report.html");
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
