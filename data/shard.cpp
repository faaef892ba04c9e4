#include "data/shard.h"

#include <algorithm>

#include "core/error.h"

namespace ember::data {

namespace {

// Takes the next sample of the epoch's order, cycling from its start (repeatedly when the epoch
// holds fewer samples than the padding needs).
class WrapAround {
 public:
  explicit WrapAround(std::vector<int64_t> head) : head_(std::move(head)) {}
  void fill(std::vector<int64_t>& batch, int64_t batch_size) {
    while (int64_t(batch.size()) < batch_size) batch.push_back(head_[next_++ % head_.size()]);
  }

 private:
  std::vector<int64_t> head_;
  size_t next_ = 0;
};

// Process r takes batches r, r + R, r + 2R, ... of each complete round of R full batches; the
// unfinished last round is dropped, handed out as it is, or completed by wrapping around.
std::vector<std::vector<int64_t>> shard_whole_batches(const std::vector<std::vector<int64_t>>& batches,
                                                      int64_t batch_size, bool drop_last, const ShardOptions& o) {
  const int64_t nb = int64_t(batches.size()), R = o.num_processes, r = o.process_index;
  std::vector<std::vector<int64_t>> mine;
  int64_t next_round = 0;  // first batch not yet handed out
  for (; next_round + R <= nb; next_round += R) {
    if (int64_t(batches[size_t(next_round + R - 1)].size()) != batch_size) break;  // a short last batch
    mine.push_back(batches[size_t(next_round + r)]);
  }
  if (drop_last || next_round == nb) return mine;
  if (!o.even_batches) {
    if (next_round + r < nb) mine.push_back(batches[size_t(next_round + r)]);
    return mine;
  }
  // The padding starts at the epoch's first samples: those of the first round of batches.
  std::vector<int64_t> head;
  for (int64_t i = 0; i < std::min(nb, R); ++i) {
    const auto& batch = batches[size_t(i)];
    head.insert(head.end(), batch.begin(), batch.end());
  }
  WrapAround wrap(std::move(head));
  for (int64_t p = 0; p < R; ++p) {  // every position in order: the padding is consumed in rank order
    std::vector<int64_t> batch;
    if (next_round + p < nb) batch = batches[size_t(next_round + p)];
    wrap.fill(batch, batch_size);
    if (p == r) mine.push_back(std::move(batch));
  }
  return mine;
}

// Process r takes slice r of every global batch; a short last batch is completed by wrapping
// around (even_batches) or sliced as far as it goes.
std::vector<std::vector<int64_t>> shard_split_batches(const std::vector<std::vector<int64_t>>& batches,
                                                      int64_t batch_size, const ShardOptions& o) {
  const int64_t slice = batch_size / o.num_processes, begin = slice * o.process_index;
  std::vector<std::vector<int64_t>> mine;
  for (const auto& global : batches) {
    std::vector<int64_t> batch = global;
    if (int64_t(batch.size()) < batch_size) {
      if (o.even_batches) {
        WrapAround(batches.front()).fill(batch, batch_size);
      } else if (int64_t(batch.size()) <= begin) {
        continue;
      }
    }
    const int64_t end = std::min<int64_t>(begin + slice, int64_t(batch.size()));
    mine.emplace_back(batch.begin() + begin, batch.begin() + end);
  }
  return mine;
}

}  // namespace

ShardedDataLoader::ShardedDataLoader(const DataLoader& base, ShardOptions opt)
    : dataset_(base.dataset_ptr()), sampler_(base.sampler_ptr()), opt_(base.options()), shard_(opt),
      drop_last_(opt.drop_last.value_or(base.options().drop_last)), epoch_(base.epoch()) {
  const int R = shard_.num_processes;
  EMBER_CHECK(R >= 1, "ShardedDataLoader: num_processes must be >= 1, got ", R);
  EMBER_CHECK(shard_.process_index >= 0 && shard_.process_index < R, "ShardedDataLoader: process_index ",
              shard_.process_index, " is out of range for num_processes ", R);
  EMBER_CHECK(!shard_.split_batches || opt_.batch_size % R == 0, "ShardedDataLoader: split_batches needs a batch_size ",
              "divisible by num_processes, got batch_size ", opt_.batch_size, " and num_processes ", R);
}

int64_t ShardedDataLoader::batch_size() const {
  return shard_.split_batches ? opt_.batch_size / shard_.num_processes : opt_.batch_size;
}

int64_t ShardedDataLoader::total_batch_size() const {
  return shard_.split_batches ? opt_.batch_size : opt_.batch_size * shard_.num_processes;
}

int64_t ShardedDataLoader::size() const {
  const int64_t n = sampler_->size(), b = opt_.batch_size, R = shard_.num_processes, r = shard_.process_index;
  const int64_t nb = drop_last_ ? n / b : (n + b - 1) / b;
  const bool short_last = !drop_last_ && n % b != 0;
  if (R == 1) return nb;
  if (shard_.split_batches) {
    if (!short_last || shard_.even_batches) return nb;
    return nb - 1 + (n % b > batch_size() * r ? 1 : 0);
  }
  if (nb % R == 0 || drop_last_) return nb / R;
  if (shard_.even_batches) return nb / R + 1;
  return nb / R + (r < nb % R ? 1 : 0);
}

int64_t ShardedDataLoader::remainder() const { return drop_last_ ? 0 : total_dataset_length() % total_batch_size(); }

int64_t ShardedDataLoader::padding_samples() const {
  const int64_t real = remainder();
  if (shard_.num_processes == 1 || drop_last_ || !shard_.even_batches || real == 0) return 0;
  return total_batch_size() - real;
}

void ShardedDataLoader::skip_first_batches(int64_t n) {
  EMBER_CHECK(n >= 0, "ShardedDataLoader: skip_first_batches needs n >= 0, got ", n);
  skip_ = n;
}

bool ShardedDataLoader::end_of_dataloader() const { return pass_ && pass_->position() >= pass_->size(); }

std::vector<std::vector<int64_t>> ShardedDataLoader::batch_indices(int64_t epoch) const {
  auto batches = make_batches(sampler_->indices(epoch), opt_.batch_size, drop_last_);
  if (shard_.num_processes == 1 || batches.empty()) return batches;
  if (shard_.split_batches) return shard_split_batches(batches, opt_.batch_size, shard_);
  return shard_whole_batches(batches, opt_.batch_size, drop_last_, shard_);
}

ShardedDataLoader::Iterator ShardedDataLoader::begin() {
  pass_.reset();  // an earlier pass stops its workers first
  auto batches = batch_indices(epoch_);
  // Batch k of every process belongs to global step k: number the batches step-major so a random
  // collate function draws differently on every process.
  std::vector<int64_t> ids(batches.size());
  for (size_t k = 0; k < ids.size(); ++k) ids[k] = int64_t(k) * shard_.num_processes + shard_.process_index;
  const int64_t first = std::min<int64_t>(skip_, int64_t(batches.size()));
  skip_ = 0;
  pass_ = std::make_shared<DataLoader::Pass>(*dataset_, std::move(batches), opt_, epoch_, first, std::move(ids));
  return Iterator(pass_);
}

}  // namespace ember::data
