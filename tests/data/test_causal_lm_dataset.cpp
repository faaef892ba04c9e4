// Causal-LM windows over a token stream: window k starts at k * (context - 1), so every token
// after the first is predicted once; the tail window is kept (padded, labels -100) only for
// evaluation. Documents are whole files separated by end-of-text; the shipped split is fixed.
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/causal_lm_dataset.h"
#include "data/text_io.h"
#include "test_util.h"

using namespace ember;
using namespace ember::data;
using ember::testing::TempDir;

namespace {

std::vector<int64_t> values(const Tensor& t) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t.reshape({-1}).select(0, i).item<int64_t>());
  return out;
}

std::vector<int64_t> iota_ids(int64_t n) {
  std::vector<int64_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), int64_t(0));
  return ids;
}

// The tokens the model predicts in example `e`: labels[1:], less the ignored ones.
std::vector<int64_t> targets(const Example& e) {
  std::vector<int64_t> out;
  const std::vector<int64_t> labels = values(e.at("labels"));
  for (size_t t = 1; t < labels.size(); ++t)
    if (labels[t] != -100) out.push_back(labels[t]);
  return out;
}

TEST(CausalLMDataset, WindowsShareOneTokenSoEveryTargetIsPredictedOnce) {
  // 11 tokens, context 4: windows [0..3], [3..6], [6..9]; token 10 is left for the tail.
  const CausalLMDataset train(iota_ids(11), 4);
  ASSERT_EQ(train.size(), 3);
  for (int64_t k = 0; k < train.size(); ++k) {
    const Example e = train.get(k);
    ASSERT_EQ(e.at("input_ids").dtype(), DType::i64);
    ASSERT_EQ(e.at("input_ids").shape(), (std::vector<int64_t>{4}));
    EXPECT_EQ(values(e.at("input_ids")), (std::vector<int64_t>{3 * k, 3 * k + 1, 3 * k + 2, 3 * k + 3}));
    EXPECT_EQ(values(e.at("labels")), values(e.at("input_ids")));  // the model shifts them itself
  }
  EXPECT_EQ(train.num_targets(), 9);

  // With the tail: a fourth window [9, 10, pad, pad], its padding ignored by the loss.
  const CausalLMDataset eval(iota_ids(11), 4, /*keep_tail=*/true);
  ASSERT_EQ(eval.size(), 4);
  EXPECT_EQ(values(eval.get(3).at("input_ids")), (std::vector<int64_t>{9, 10, 0, 0}));
  EXPECT_EQ(values(eval.get(3).at("labels")), (std::vector<int64_t>{9, 10, -100, -100}));
  std::vector<int64_t> all;
  for (int64_t k = 0; k < eval.size(); ++k)
    for (const int64_t t : targets(eval.get(k))) all.push_back(t);
  const std::vector<int64_t> stream = iota_ids(11);
  EXPECT_EQ(all, std::vector<int64_t>(stream.begin() + 1, stream.end()));
  EXPECT_EQ(eval.num_targets(), 10);
}

TEST(CausalLMDataset, AStreamThatEndsOnAWindowHasNoTail) {
  // 10 tokens, context 4: three full windows, the last ending at token 9.
  const CausalLMDataset full(iota_ids(10), 4, /*keep_tail=*/true);
  EXPECT_EQ(full.size(), 3);
  EXPECT_EQ(full.num_targets(), 9);
  EXPECT_EQ(values(full.get(2).at("labels")), (std::vector<int64_t>{6, 7, 8, 9}));
  // Shorter than one window: training has nothing, evaluation one padded window.
  EXPECT_EMBER_ERROR(CausalLMDataset(iota_ids(3), 4), "3 tokens", "shorter than one window of 4");
  const CausalLMDataset short_eval(iota_ids(3), 4, true);
  EXPECT_EQ(short_eval.size(), 1);
  EXPECT_EQ(short_eval.num_targets(), 2);
}

TEST(CausalLMDataset, RefusesBadArguments) {
  EXPECT_EMBER_ERROR(CausalLMDataset(iota_ids(10), 1), "context must be at least 2", "got 1");
  EXPECT_EMBER_ERROR(CausalLMDataset(iota_ids(1), 4, true), "at least 2 tokens, got 1");
  const CausalLMDataset d(iota_ids(10), 4);
  EXPECT_EMBER_ERROR(d.get(3), "index 3 out of range for 3 examples");
  EXPECT_EMBER_ERROR(d.get(-1), "index -1 out of range");
}

TEST(CausalLMDataset, FilesAreDocumentsSeparatedByEndOfText) {
  TempDir dir("causal_lm_files");
  const std::string a = dir.write("a.txt", "hi\r\nyo\n");
  const std::string b = dir.file("b.txt.gz");
  write_text_file(b, std::string("caf\xE9"), /*gzip=*/true);  // a Latin-1 byte, read as UTF-8 é
  EXPECT_EQ(read_documents({a, b}), (std::vector<std::string>{"hi\nyo", "caf\xC3\xA9"}));
  const auto d = CausalLMDataset::from_files(ByteTokenizer(), {a, b}, 4, true);
  EXPECT_EQ(d->ids(), (std::vector<int64_t>{'h', 'i', '\n', 'y', 'o', 256, 'c', 'a', 'f', 0xC3, 0xA9, 256}));
  EXPECT_EMBER_ERROR(CausalLMDataset::from_files(ByteTokenizer(), {a, dir.file("missing.txt")}, 4),
                     "missing.txt");
  EXPECT_EMBER_ERROR(CausalLMDataset::from_files(ByteTokenizer(), {}, 4), "no files given");
}

TEST(CausalLMDataset, TheShippedSplitIsWikiTextTestForValidationAndTheRestForTraining) {
  const std::string datasets = std::string(EMBER_SOURCE_DIR) + "/datasets";
  const CausalLMFiles files = shipped_corpus_split(datasets);
  ASSERT_EQ(files.validation.size(), 1u);
  EXPECT_EQ(std::filesystem::path(files.validation[0]).filename(), "wikitext2_raw_test.txt.gz");
  ASSERT_EQ(files.train.size(), 14u);  // WikiText-2 valid and the 13 books (datasets/README.md)
  EXPECT_EQ(std::filesystem::path(files.train[0]).filename(), "wikitext2_raw_valid.txt.gz");
  EXPECT_EQ(std::filesystem::path(files.train[1]).filename(), "austen-emma.txt.gz");
  EXPECT_EQ(std::filesystem::path(files.train.back()).filename(), "whitman-leaves.txt.gz");
  for (const auto& f : files.train) EXPECT_NE(f, files.validation[0]);
  EXPECT_EQ(shipped_corpus_split(datasets).train, files.train);  // the same every time

  // The validation stream: the test file's bytes (less its CRs) and one end-of-text.
  const auto eval = CausalLMDataset::from_files(ByteTokenizer(), files.validation, 128, true);
  int64_t end_of_text = 0;
  for (const int64_t id : eval->ids()) end_of_text += id == 256;
  EXPECT_EQ(end_of_text, 1);
  EXPECT_EQ(eval->ids().back(), 256);
  EXPECT_GT(eval->ids().size(), 1'200'000u);
  EXPECT_EQ(eval->num_targets(), int64_t(eval->ids().size()) - 1);

  // A datasets directory without the corpus: the error names the file it looked for.
  TempDir dir("causal_lm_split");
  EXPECT_EMBER_ERROR(shipped_corpus_split(dir.path()), "wikitext2_raw_test.txt.gz", "is missing");
  std::filesystem::create_directories(dir.file("corpus"));
  dir.write("corpus/wikitext2_raw_test.txt.gz", "x");
  dir.write("corpus/wikitext2_raw_valid.txt.gz", "y");
  EXPECT_EMBER_ERROR(shipped_corpus_split(dir.path()), "corpus/gutenberg", "is missing");
}

}  // namespace
