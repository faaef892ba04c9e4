#include "accelerate/accelerated_dataloader.h"

#include <algorithm>

#include "core/error.h"

namespace ember::distributed {

// Held by the iterators of one pass: the loader is the GradientState's active one until the
// pass ends or its last iterator goes away (a loop left with `break`).
struct AcceleratedDataLoader::ActivePass {
  ActivePass(std::shared_ptr<GradientState> gs, const data::ShardedDataLoader* loader)
      : gradient_state(std::move(gs)), shard(loader) {
    gradient_state->push_active(shard);
  }
  ~ActivePass() { gradient_state->pop_active(shard); }
  ActivePass(const ActivePass&) = delete;
  ActivePass& operator=(const ActivePass&) = delete;

  std::shared_ptr<GradientState> gradient_state;
  const data::ShardedDataLoader* shard;
};

AcceleratedDataLoader::AcceleratedDataLoader(const data::DataLoader& base, data::ShardOptions shard,
                                             std::shared_ptr<GradientState> gradient_state, Device device)
    : dataset_(base.dataset_ptr()), base_options_(base.options()), shard_(base, shard),
      gradient_state_(std::move(gradient_state)), device_(device), epoch_(base.epoch()) {
  EMBER_CHECK(gradient_state_ != nullptr, "AcceleratedDataLoader: needs a GradientState");
}

void AcceleratedDataLoader::use_seed(uint64_t seed) {
  std::shared_ptr<const data::Sampler> sampler = shard_.sampler().with_seed(seed);
  EMBER_CHECK(sampler != nullptr, "AcceleratedDataLoader: its sampler has no seed to replace");
  data::DataLoaderOptions options = base_options_;
  options.shuffle = false;  // the sampler decides the order
  options.seed = seed;
  data::DataLoader base(dataset_, std::move(sampler), std::move(options));
  base.set_epoch(shard_.epoch());
  shard_ = data::ShardedDataLoader(base, shard_.shard_options());
}

AcceleratedDataLoader::~AcceleratedDataLoader() = default;

void AcceleratedDataLoader::set_epoch(int64_t epoch) {
  EMBER_CHECK(epoch >= 0, "AcceleratedDataLoader::set_epoch: epoch must be >= 0, got ", epoch);
  if (resume_ && resume_->epoch != epoch) resume_.reset();
  if (epoch != epoch_) position_ = 0;
  epoch_ = epoch;
}

void AcceleratedDataLoader::skip_first_batches(int64_t n) {
  EMBER_CHECK(n >= 0, "AcceleratedDataLoader::skip_first_batches: n must be >= 0, got ", n);
  resume_ = LoaderPosition{epoch_, n};
}

LoaderPosition AcceleratedDataLoader::state() const {
  const data::Sampler& sampler = shard_.sampler();
  const std::optional<uint64_t> seed = sampler.seed_was_drawn() ? sampler.seed() : std::nullopt;
  if (position_ >= size()) return {epoch_ + 1, 0, seed, total_batch_size()};
  return {epoch_, position_, seed, total_batch_size()};
}

void AcceleratedDataLoader::validate_state(const LoaderPosition& p) const {
  EMBER_CHECK(p.epoch >= 0 && p.position >= 0, "AcceleratedDataLoader: cannot resume at epoch ", p.epoch,
              ", batch ", p.position);
  // state() stores the end of an epoch as the start of the next, so a saved position is
  // always inside its epoch.
  EMBER_CHECK(p.position == 0 || p.position < size(), "AcceleratedDataLoader: cannot resume at batch ", p.position,
              " of epoch ", p.epoch, ": an epoch has ", size(), " batches on this process");
}

void AcceleratedDataLoader::restore(const LoaderPosition& p) {
  validate_state(p);
  // A drawn seed comes back with the position; a seed given in the options wins.
  const data::Sampler& sampler = shard_.sampler();
  if (p.seed && sampler.seed_was_drawn() && sampler.seed() != p.seed) use_seed(*p.seed);
  epoch_ = p.epoch;
  position_ = p.position;
  if (p.position > 0) {
    resume_ = p;
  } else {
    resume_.reset();
  }
}

AcceleratedDataLoader::Iterator AcceleratedDataLoader::begin() {
  int64_t skip = 0;
  if (resume_ && resume_->epoch == epoch_) skip = std::min(resume_->position, size());
  resume_.reset();
  shard_.set_epoch(epoch_);
  shard_.skip_first_batches(skip);
  position_ = skip;
  auto pass = std::make_shared<ActivePass>(gradient_state_, &shard_);
  auto inner = shard_.begin();
  if (inner == shard_.end()) {
    on_pass_end();
    return end();
  }
  return Iterator(this, std::move(pass), std::move(inner));
}

AcceleratedDataLoader::Iterator AcceleratedDataLoader::end() { return Iterator(); }

void AcceleratedDataLoader::on_batch() { ++position_; }

void AcceleratedDataLoader::on_pass_end() {
  ++epoch_;
  position_ = 0;
}

AcceleratedDataLoader::Iterator::Iterator(AcceleratedDataLoader* owner, std::shared_ptr<ActivePass> pass,
                                          data::ShardedDataLoader::Iterator inner)
    : owner_(owner), pass_(std::move(pass)), inner_(std::move(inner)) {
  load_current();
}

void AcceleratedDataLoader::Iterator::load_current() {
  // Pinned batches go up asynchronously: the step's kernels queue behind the copy on the
  // same stream, and the host is free to prepare the next batch.
  current_ = owner_->device_.is_cpu() ? *inner_ : inner_->to(owner_->device_, /*non_blocking=*/true);
  owner_->on_batch();
}

AcceleratedDataLoader::Iterator& AcceleratedDataLoader::Iterator::operator++() {
  EMBER_CHECK(owner_ != nullptr, "AcceleratedDataLoader: cannot advance past the end of the epoch");
  ++inner_;
  if (inner_ == data::ShardedDataLoader::Iterator()) {
    owner_->on_pass_end();
    owner_ = nullptr;
    pass_.reset();
    current_ = Batch{};
    return *this;
  }
  load_current();
  return *this;
}

}  // namespace ember::distributed
