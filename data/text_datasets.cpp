#include "data/text_datasets.h"

#include "core/factory.h"
#include "data/text_io.h"

namespace ember::data {

namespace {
Example ids_example(const std::vector<int64_t>& ids, const std::vector<int64_t>& types) {
  const int64_t n = int64_t(ids.size());
  Example e;
  e["input_ids"] = from_vector(ids, {n});
  e["attention_mask"] = ones({n}, {DType::i64});
  e["token_type_ids"] = types.empty() ? zeros({n}, {DType::i64}) : from_vector(types, {n});
  return e;
}
}  // namespace

PackedTextDataset::PackedTextDataset(const WordPieceTokenizer& tok, const std::vector<std::string>& files,
                                     int64_t seq_len, int64_t max_examples) {
  EMBER_CHECK(seq_len >= 3, "PackedTextDataset: seq_len must be at least 3, got ", seq_len);
  const size_t body = size_t(seq_len - 2);
  std::vector<int64_t> current;
  current.reserve(body);
  EncodeOptions opt;
  opt.add_special_tokens = false;
  opt.truncation = false;
  auto flush = [&] {
    std::vector<int64_t> ex;
    ex.reserve(current.size() + 2);
    ex.push_back(tok.cls_id());
    ex.insert(ex.end(), current.begin(), current.end());
    ex.push_back(tok.sep_id());
    chunks_.push_back(std::move(ex));
    current.clear();
  };
  for (const auto& path : files) {
    LineReader reader(path);
    std::string line;
    while (reader.next(line)) {
      if (max_examples >= 0 && int64_t(chunks_.size()) >= max_examples) return;
      const Encoding enc = tok.encode(line, opt);
      for (int64_t id : enc.input_ids) {
        current.push_back(id);
        ++num_tokens_;
        if (current.size() == body) {
          flush();
          if (max_examples >= 0 && int64_t(chunks_.size()) >= max_examples) return;
        }
      }
    }
  }
  if (current.size() >= body / 2) flush();  // keep a substantial tail, drop a scrap
}

Example PackedTextDataset::get(int64_t index) const {
  EMBER_CHECK(index >= 0 && index < size(), "PackedTextDataset: index ", index, " out of range for ", size(), " examples");
  return ids_example(chunks_[size_t(index)], {});
}

TextClassificationDataset::TextClassificationDataset(const WordPieceTokenizer& tok, const LabeledTexts& texts,
                                                     int64_t max_length) {
  EncodeOptions opt;
  opt.max_length = max_length;
  encodings_.reserve(size_t(texts.size()));
  for (int64_t i = 0; i < texts.size(); ++i) encodings_.push_back(tok.encode(texts.texts[size_t(i)], opt));
  labels_ = texts.labels;
}

Example TextClassificationDataset::get(int64_t index) const {
  EMBER_CHECK(index >= 0 && index < size(), "TextClassificationDataset: index ", index, " out of range for ", size(),
              " examples");
  const Encoding& enc = encodings_[size_t(index)];
  Example e = ids_example(enc.input_ids, enc.token_type_ids);
  e["labels"] = scalar_tensor(double(labels_[size_t(index)]), {DType::i64});
  return e;
}

std::vector<int64_t> TextClassificationDataset::lengths() const {
  std::vector<int64_t> out;
  out.reserve(encodings_.size());
  for (const Encoding& e : encodings_) out.push_back(int64_t(e.input_ids.size()));
  return out;
}

}  // namespace ember::data
