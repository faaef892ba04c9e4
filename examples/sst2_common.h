// What the two SST-2 fine-tuning examples share: options, data, model, the progress postfix.
// The examples themselves (sst2_finetune.cpp, sst2_finetune_accelerate.cpp) hold only the
// training loop, so that they differ in the Accelerator lines alone.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "data/dataloader.h"
#include "data/length_grouped_sampler.h"
#include "data/text_datasets.h"
#include "data/tsv_dataset.h"
#include "data/wordpiece_tokenizer.h"
#include "ember/ember.h"
#include "nn/models/bert.h"
#include "nn/models/pretrained.h"

namespace sst2 {
using namespace ember;

struct Options {
  std::string data_dir = std::string(EMBER_SOURCE_DIR) + "/datasets";
  std::string pretrained;  // a save_pretrained directory to start from (default: random weights)
  int64_t epochs = 1;
  int64_t batch = 32;
  double lr = 2e-4;
  int64_t max_len = 66;
  int64_t train_limit = -1;  // only the first N training phrases (quick checks)
  uint64_t seed = 0;
  int threads = 0;
  // Where the Accelerator example logs (metrics.jsonl, TensorBoard events, report.html under
  // <project_dir>/sst2_finetune_accelerate/); the plain example ignores it.
  std::string project_dir = "runs";
  // How DDP sends gradients between processes (the Accelerator example only): no, fp16, bf16
  // or power_sgd (rank --powersgd-rank), as DistributedDataParallelKwargs(comm_hook=...).
  std::string comm_hook = "no";
  int powersgd_rank = 4;
};

inline Options parse(int argc, char** argv, const char* program) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::printf("usage: %s [--epochs N] [--batch B] [--lr X] [--max-len L] [--pretrained DIR]\n"
                  "       [--data-dir D] [--train-limit N] [--seed S] [--threads T] [--project-dir D]\n"
                  "       [--comm-hook no|fp16|bf16|power_sgd] [--powersgd-rank R]\n", program);
      std::exit(0);
    }
    EMBER_CHECK(i + 1 < argc, program, ": ", k, " needs a value");
    const std::string v = argv[++i];
    if (k == "--epochs") o.epochs = std::stoll(v);
    else if (k == "--batch") o.batch = std::stoll(v);
    else if (k == "--lr") o.lr = std::stod(v);
    else if (k == "--max-len") o.max_len = std::stoll(v);
    else if (k == "--pretrained") o.pretrained = v;
    else if (k == "--data-dir") o.data_dir = v;
    else if (k == "--train-limit") o.train_limit = std::stoll(v);
    else if (k == "--seed") o.seed = std::stoull(v);
    else if (k == "--threads") o.threads = std::stoi(v);
    else if (k == "--project-dir") o.project_dir = v;
    else if (k == "--comm-hook") o.comm_hook = v;
    else if (k == "--powersgd-rank") o.powersgd_rank = std::stoi(v);
    else EMBER_FAIL(program, ": unknown option ", k, " (see --help)");
  }
  return o;
}

struct Data {
  std::shared_ptr<data::TextClassificationDataset> train, dev;
  int64_t vocab_size = 0;
};

inline Data load(const Options& o) {
  auto tok = data::WordPieceTokenizer::from_file(o.data_dir + "/vocab/bert-base-uncased-vocab.txt.gz");
  auto train_texts = data::read_labeled_tsv(o.data_dir + "/sst2/train.tsv.gz");
  if (o.train_limit >= 0 && o.train_limit < train_texts.size()) {
    train_texts.texts.resize(size_t(o.train_limit));
    train_texts.labels.resize(size_t(o.train_limit));
  }
  auto dev_texts = data::read_labeled_tsv(o.data_dir + "/sst2/dev.tsv.gz");
  return {std::make_shared<data::TextClassificationDataset>(tok, train_texts, o.max_len),
          std::make_shared<data::TextClassificationDataset>(tok, dev_texts, 128), tok.vocab_size()};
}

// Shuffled batches of similar-length phrases (little padding), padded per batch.
inline data::DataLoader train_loader(const Options& o, const Data& d) {
  auto order = std::make_shared<data::LengthGroupedSampler>(d.train->lengths(), o.batch, o.seed);
  return data::DataLoader(d.train, order, {.batch_size = o.batch, .collate = data::PadCollate()});
}

inline data::DataLoader eval_loader(const Data& d) {
  return data::DataLoader(d.dev, {.batch_size = 128, .collate = data::PadCollate()});
}

// What the training progress bar shows after each step.
inline std::string loss_postfix(const Tensor& loss) {
  char text[32];
  std::snprintf(text, sizeof text, "loss %.4f", loss.item<double>());
  return text;
}

// BERT-mini with a classification head: from `pretrained` when given, else freshly initialised.
inline std::shared_ptr<nn::BertForSequenceClassification> model(const Options& o, const Data& d) {
  if (!o.pretrained.empty()) return nn::from_pretrained<nn::BertForSequenceClassification>(o.pretrained);
  return std::make_shared<nn::BertForSequenceClassification>(nn::BertConfig::mini(d.vocab_size));
}

}  // namespace sst2
