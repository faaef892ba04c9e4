#include "core/storage.h"

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
  if (allocator_) {
    allocator_->deallocate(data_, nbytes_);
  } else if (deleter_) {
    deleter_(data_);
  }
}

}  // namespace ember
