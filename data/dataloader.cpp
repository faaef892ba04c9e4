#include "data/dataloader.h"

#include <algorithm>

#include "core/device_api.h"
#include "core/grad_mode.h"

namespace ember::data {

namespace {
std::shared_ptr<const Sampler> default_sampler(const std::shared_ptr<const Dataset>& d, const DataLoaderOptions& o) {
  EMBER_CHECK(d != nullptr, "DataLoader: dataset is null");
  if (o.shuffle) return std::make_shared<RandomSampler>(d->size(), o.seed);
  return std::make_shared<SequentialSampler>(d->size());
}
}  // namespace

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions opt)
    : dataset_(std::move(dataset)), opt_(std::move(opt)) {
  sampler_ = default_sampler(dataset_, opt_);
  validate();
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<const Sampler> sampler,
                       DataLoaderOptions opt)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)), opt_(std::move(opt)) {
  EMBER_CHECK(!opt_.shuffle, "DataLoader: shuffle cannot be combined with an explicit sampler (the sampler "
              "decides the order)");
  EMBER_CHECK(sampler_ != nullptr, "DataLoader: sampler is null");
  validate();
}

void DataLoader::validate() {
  EMBER_CHECK(dataset_ != nullptr, "DataLoader: dataset is null");
  EMBER_CHECK(opt_.batch_size > 0, "DataLoader: batch_size must be positive, got ", opt_.batch_size);
  EMBER_CHECK(opt_.num_workers >= 0, "DataLoader: num_workers must be >= 0, got ", opt_.num_workers);
  EMBER_CHECK(opt_.prefetch_factor >= 1, "DataLoader: prefetch_factor must be >= 1, got ", opt_.prefetch_factor);
  if (!opt_.collate) {
    opt_.collate = [](const std::vector<Example>& e, const CollateContext& c) { return stack_collate(e, c); };
  }
}

DataLoader::~DataLoader() = default;

int64_t DataLoader::size() const {
  const int64_t n = sampler_->size(), b = opt_.batch_size;
  return opt_.drop_last ? n / b : (n + b - 1) / b;
}

DataLoader::Iterator DataLoader::begin() {
  pass_.reset();  // an earlier pass stops its workers first
  auto batches = make_batches(sampler_->indices(epoch_), opt_.batch_size, opt_.drop_last);
  const int64_t first = std::min<int64_t>(skip_, int64_t(batches.size()));
  skip_ = 0;
  pass_ = std::make_shared<Pass>(*dataset_, std::move(batches), opt_, epoch_, first);
  return Iterator(pass_);
}

DataLoader::Iterator DataLoader::end() { return Iterator(); }

DataLoader::Pass::Pass(const Dataset& dataset, std::vector<std::vector<int64_t>> batches,
                       const DataLoaderOptions& opt, int64_t epoch, int64_t first_batch,
                       std::vector<int64_t> collate_ids)
    : dataset_(dataset), batches_(std::move(batches)), collate_ids_(std::move(collate_ids)), opt_(opt),
      collate_(opt.collate), pin_(opt.pin_memory && pinned_allocator() != nullptr && cuda_is_available()),
      epoch_(epoch), next_index_(first_batch), next_to_build_(first_batch) {
  EMBER_CHECK(collate_ids_.empty() || collate_ids_.size() == batches_.size(), "DataLoader: ",
              collate_ids_.size(), " collate ids given for ", batches_.size(), " batches");
  for (int w = 0; w < opt_.num_workers; ++w) workers_.emplace_back([this] { worker_loop(); });
}

DataLoader::Pass::~Pass() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

Batch DataLoader::Pass::build(int64_t batch_index) {
  NoGradGuard ng;
  std::vector<Example> examples;
  const auto& idx = batches_[size_t(batch_index)];
  examples.reserve(idx.size());
  for (int64_t i : idx) examples.push_back(dataset_.get(i));
  const int64_t id = collate_ids_.empty() ? batch_index : collate_ids_[size_t(batch_index)];
  Batch batch = collate_(examples, CollateContext{epoch_, id});
  // Pinning runs here, on the worker that built the batch, so the copy into page-locked
  // memory overlaps with the training step like the collation does.
  return pin_ ? batch.pin_memory() : batch;
}

void DataLoader::Pass::worker_loop() {
  const int64_t window = int64_t(opt_.num_workers) * opt_.prefetch_factor;
  while (true) {
    int64_t mine;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Claim the next batch once the prefetch window has room.
      cv_.wait(lock, [&] { return stop_ || next_to_build_ >= int64_t(batches_.size()) ||
                                  next_to_build_ < next_index_ + window; });
      if (stop_ || next_to_build_ >= int64_t(batches_.size())) return;
      mine = next_to_build_++;
    }
    try {
      Batch b = build(mine);
      std::lock_guard<std::mutex> lock(mu_);
      ready_[mine] = std::move(b);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      errors_[mine] = std::current_exception();
    }
    cv_.notify_all();
  }
}

std::optional<Batch> DataLoader::Pass::next() {
  if (next_index_ >= int64_t(batches_.size())) return std::nullopt;
  if (workers_.empty()) return build(next_index_++);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return ready_.count(next_index_) || errors_.count(next_index_); });
  if (auto e = errors_.find(next_index_); e != errors_.end()) {
    std::exception_ptr err = e->second;
    errors_.erase(e);
    ++next_index_;
    lock.unlock();
    cv_.notify_all();
    std::rethrow_exception(err);
  }
  Batch b = std::move(ready_[next_index_]);
  ready_.erase(next_index_);
  ++next_index_;
  lock.unlock();
  cv_.notify_all();
  return b;
}

DataLoader::Iterator::Iterator(std::shared_ptr<Pass> pass) : pass_(std::move(pass)) { current_ = pass_->next(); }

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  current_ = pass_->next();
  return *this;
}

}  // namespace ember::data
