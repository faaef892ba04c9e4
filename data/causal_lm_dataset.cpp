#include "data/causal_lm_dataset.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/factory.h"
#include "data/text_io.h"

namespace ember::data {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kIgnoreIndex = -100;  // labels the loss skips (GPT2LMHeadModel, cross_entropy)

std::string checked_file(const fs::path& path) {
  EMBER_CHECK(fs::is_regular_file(path), "causal LM corpus: ", path.string(), " is missing (see datasets/README.md)");
  return path.string();
}

}  // namespace

CausalLMFiles shipped_corpus_split(const std::string& datasets_dir) {
  const fs::path corpus = fs::path(datasets_dir) / "corpus";
  const fs::path gutenberg = corpus / "gutenberg";
  CausalLMFiles files;
  files.validation.push_back(checked_file(corpus / "wikitext2_raw_test.txt.gz"));
  files.train.push_back(checked_file(corpus / "wikitext2_raw_valid.txt.gz"));
  EMBER_CHECK(fs::is_directory(gutenberg), "causal LM corpus: ", gutenberg.string(),
              " is missing (see datasets/README.md)");
  std::vector<std::string> books;
  for (const auto& entry : fs::directory_iterator(gutenberg)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && name.size() > 7 && name.ends_with(".txt.gz")) books.push_back(entry.path().string());
  }
  EMBER_CHECK(!books.empty(), "causal LM corpus: no *.txt.gz books in ", gutenberg.string());
  std::sort(books.begin(), books.end());
  files.train.insert(files.train.end(), books.begin(), books.end());
  return files;
}

std::vector<std::string> read_documents(const std::vector<std::string>& files) {
  std::vector<std::string> documents;
  documents.reserve(files.size());
  for (const auto& path : files) {
    LineReader reader(path);
    std::string document, line;
    for (bool first = true; reader.next(line); first = false) {
      if (!first) document += '\n';
      document += line;
    }
    documents.push_back(std::move(document));
  }
  return documents;
}

CausalLMDataset::CausalLMDataset(std::vector<int64_t> ids, int64_t context, bool keep_tail)
    : ids_(std::move(ids)), context_(context) {
  EMBER_CHECK(context >= 2, "CausalLMDataset: context must be at least 2 tokens, got ", context);
  const int64_t n = int64_t(ids_.size());
  EMBER_CHECK(n >= 2, "CausalLMDataset: the token stream needs at least 2 tokens, got ", n);
  EMBER_CHECK(keep_tail || n >= context, "CausalLMDataset: the token stream (", n,
              " tokens) is shorter than one window of ", context, " tokens");
  // Window k covers [k * stride, k * stride + context); its targets (the tokens after its first)
  // are k * stride + 1 .. (k + 1) * stride.
  const int64_t stride = context - 1;
  num_windows_ = keep_tail ? (n - 1 + stride - 1) / stride : (n - context) / stride + 1;
}

std::shared_ptr<CausalLMDataset> CausalLMDataset::from_files(const ByteTokenizer& tok,
                                                             const std::vector<std::string>& files, int64_t context,
                                                             bool keep_tail) {
  EMBER_CHECK(!files.empty(), "CausalLMDataset: no files given");
  return std::make_shared<CausalLMDataset>(tok.encode_documents(read_documents(files)), context, keep_tail);
}

Example CausalLMDataset::get(int64_t index) const {
  EMBER_CHECK(index >= 0 && index < size(), "CausalLMDataset: index ", index, " out of range for ", size(),
              " examples");
  const int64_t begin = index * (context_ - 1);
  const int64_t real = std::min<int64_t>(context_, int64_t(ids_.size()) - begin);
  std::vector<int64_t> input_ids(ids_.begin() + begin, ids_.begin() + begin + real);
  std::vector<int64_t> labels = input_ids;
  input_ids.resize(size_t(context_), 0);
  labels.resize(size_t(context_), kIgnoreIndex);
  Example e;
  e["input_ids"] = from_vector(input_ids, {context_});
  e["labels"] = from_vector(labels, {context_});
  return e;
}

int64_t CausalLMDataset::num_targets() const {
  const int64_t last_begin = (num_windows_ - 1) * (context_ - 1);
  const int64_t last_real = std::min<int64_t>(context_, int64_t(ids_.size()) - last_begin);
  return (num_windows_ - 1) * (context_ - 1) + last_real - 1;
}

}  // namespace ember::data
