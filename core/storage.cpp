#include "core/storage.h"

#include "core/error.h"

namespace ember {

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  allocator_ = &allocator_for(device);
  data_ = nbytes ? allocator_->allocate_on(device, nbytes) : nullptr;
}

Storage::Storage(size_t nbytes, Device device, Allocator& allocator)
    : nbytes_(nbytes), device_(device), allocator_(&allocator) {
  data_ = nbytes ? allocator_->allocate_on(device, nbytes) : nullptr;
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (released_) return;
  if (allocator_) {
    allocator_->deallocate(data_, nbytes_);
  } else if (deleter_) {
    deleter_(data_);
  }
}

void Storage::release_memory() {
  EMBER_CHECK(allocator_ != nullptr, "release_memory: this storage wraps memory Ember does not own");
  if (released_) return;
  allocator_->deallocate(data_, nbytes_);
  data_ = nullptr;
  released_ = true;
}

void Storage::restore_memory() {
  if (!released_) return;
  data_ = nbytes_ ? allocator_->allocate_on(device_, nbytes_) : nullptr;  // may throw: still released
  released_ = false;
}

void Storage::throw_released() {
  EMBER_FAIL("this tensor's memory was released: it views a parameter that sharded data parallel (FULL_SHARD) "
             "holds only as shards outside its unit's forward and backward; read it inside "
             "FullyShardedDataParallel::summon_full_params(), or use full_state_dict()");
}

}  // namespace ember
