// Tokenized datasets built from text files: packed sequences for masked-LM pretraining and
// labelled sentences for classification.
#pragma once
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/tsv_dataset.h"
#include "data/wordpiece_tokenizer.h"

namespace ember::data {

// Every line of every file is tokenized; the token stream is cut into chunks of seq_len - 2
// and each example is [CLS] chunk [SEP], as BERT pretraining packs text. Fields: input_ids,
// attention_mask, token_type_ids (1-d i64).
class PackedTextDataset : public Dataset {
 public:
  PackedTextDataset(const WordPieceTokenizer& tok, const std::vector<std::string>& files, int64_t seq_len,
                    int64_t max_examples = -1);
  int64_t size() const override { return int64_t(chunks_.size()); }
  Example get(int64_t index) const override;
  int64_t num_tokens() const { return num_tokens_; }

 private:
  std::vector<std::vector<int64_t>> chunks_;
  int64_t num_tokens_ = 0;
};

// Sentences with integer labels, tokenized once up front (truncated to max_length). Fields:
// input_ids, attention_mask, token_type_ids (1-d i64) and labels (0-d i64).
class TextClassificationDataset : public Dataset {
 public:
  TextClassificationDataset(const WordPieceTokenizer& tok, const LabeledTexts& texts, int64_t max_length);
  int64_t size() const override { return int64_t(encodings_.size()); }
  Example get(int64_t index) const override;
  const std::vector<int64_t>& labels() const { return labels_; }
  // Token count of every example (for length-grouped batching).
  std::vector<int64_t> lengths() const;

 private:
  std::vector<Encoding> encodings_;
  std::vector<int64_t> labels_;
};

}  // namespace ember::data
