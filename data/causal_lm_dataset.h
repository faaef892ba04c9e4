// Fixed-length windows of one token stream, for causal language modelling (GPT-2 and alike).
//
// The stream: each file is one document, its lines (read by data/text_io.h: gzip or plain, CRLF
// or LF, stray Latin-1 bytes as their characters) joined by "\n", byte-tokenized
// (data/byte_tokenizer.h) and followed by the end-of-text id.
//
// The windows: example k holds the `context` tokens starting at k * (context - 1), as
// input_ids and as labels (1-d i64). nn::GPT2LMHeadModel shifts the labels itself (position t
// predicts labels[t + 1]), so a window of `context` tokens trains `context - 1` predictions, and
// consecutive windows share one token: every token of the stream after the first is a target
// exactly once. Training drops the last, shorter window (every batch full); evaluation keeps it
// (keep_tail), padded to `context` with id 0 and labels -100 there, so that the
// evaluation covers the whole stream. Padding sits only at the end, where causal attention
// keeps it out of every real position, so no attention mask is needed.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/byte_tokenizer.h"
#include "data/dataset.h"

namespace ember::data {

// The files of one split, in the order they are read.
struct CausalLMFiles {
  std::vector<std::string> train, validation;
};

// The split of the corpus shipped under <datasets_dir>/corpus (datasets/README.md):
// validation is WikiText-2's test file (wikitext2_raw_test.txt.gz); training is WikiText-2's
// validation file (wikitext2_raw_valid.txt.gz) followed by every Gutenberg book
// (gutenberg/*.txt.gz) in file-name order. Fixed by the file names, so every process and every
// run gets the same split. Raises ember::Error naming a file or directory that is missing.
CausalLMFiles shipped_corpus_split(const std::string& datasets_dir);

// Every file as one document (see above), in order. Errors name the file.
std::vector<std::string> read_documents(const std::vector<std::string>& files);

class CausalLMDataset : public Dataset {
 public:
  // `ids`: the token stream (at least 2 ids); `context`: tokens per example (at least 2).
  CausalLMDataset(std::vector<int64_t> ids, int64_t context, bool keep_tail = false);
  // The stream of `files` (documents separated by the tokenizer's end-of-text id).
  static std::shared_ptr<CausalLMDataset> from_files(const ByteTokenizer& tok, const std::vector<std::string>& files,
                                                     int64_t context, bool keep_tail = false);

  int64_t size() const override { return num_windows_; }
  // input_ids and labels, [context] i64 each.
  Example get(int64_t index) const override;

  int64_t context() const { return context_; }
  const std::vector<int64_t>& ids() const { return ids_; }
  // Tokens predicted over all the examples (labels that are not -100, less each window's first).
  int64_t num_targets() const;

 private:
  std::vector<int64_t> ids_;
  int64_t context_;
  int64_t num_windows_;
};

}  // namespace ember::data
