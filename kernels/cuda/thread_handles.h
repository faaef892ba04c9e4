// Per-thread library handles (cuBLAS, cuBLASLt, cuDNN), one per device, created on first use
// and kept: creating a handle costs far more than the call it serves. A thread that exits puts
// its handles on a shelf for the next thread instead of destroying them; the shelf is never
// destroyed, since destroying a handle at process exit could run after the driver shut down.
//
//   HandleShelf<cudnnHandle_t>& shelf() { static auto* s = new HandleShelf<cudnnHandle_t>; return *s; }
//   thread_local ThreadHandles<cudnnHandle_t> tls{&shelf()};
//   cudnnHandle_t h = tls.get(current_device(), [] { cudnnHandle_t h; ...Create(&h); return h; });
#pragma once
#include <cstddef>
#include <mutex>
#include <vector>

namespace ember::cuda {

template <typename H>
struct HandleShelf {
  std::mutex mu;
  std::vector<std::vector<H>> free;  // per device
};

template <typename H>
class ThreadHandles {
 public:
  explicit ThreadHandles(HandleShelf<H>* shelf) : shelf_(shelf) {}
  ThreadHandles(const ThreadHandles&) = delete;
  ThreadHandles& operator=(const ThreadHandles&) = delete;

  ~ThreadHandles() {
    std::lock_guard<std::mutex> lock(shelf_->mu);
    for (size_t d = 0; d < mine_.size(); ++d)
      if (mine_[d]) {
        if (shelf_->free.size() <= d) shelf_->free.resize(d + 1);
        shelf_->free[d].push_back(mine_[d]);
      }
  }

  // The calling thread's handle for `device`: its own, else one from the shelf, else create().
  template <typename Create>
  H get(int device, const Create& create) {
    const size_t d = size_t(device);
    if (mine_.size() <= d) mine_.resize(d + 1, H{});
    if (!mine_[d]) mine_[d] = take_shelved(d);
    if (!mine_[d]) mine_[d] = create();
    return mine_[d];
  }

 private:
  H take_shelved(size_t d) {
    std::lock_guard<std::mutex> lock(shelf_->mu);
    if (d >= shelf_->free.size() || shelf_->free[d].empty()) return H{};
    H h = shelf_->free[d].back();
    shelf_->free[d].pop_back();
    return h;
  }

  HandleShelf<H>* shelf_;
  std::vector<H> mine_;
};

}  // namespace ember::cuda
