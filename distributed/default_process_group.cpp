#include "distributed/default_process_group.h"

#include <mutex>
#include <utility>

namespace ember::distributed {

namespace {
std::mutex default_mutex;
std::shared_ptr<ProcessGroup>& default_group() {
  static std::shared_ptr<ProcessGroup> group;
  return group;
}
}  // namespace

void set_default_process_group(std::shared_ptr<ProcessGroup> pg) {
  std::lock_guard<std::mutex> lock(default_mutex);
  default_group() = std::move(pg);
}

std::shared_ptr<ProcessGroup> default_process_group() {
  std::lock_guard<std::mutex> lock(default_mutex);
  return default_group();
}

}  // namespace ember::distributed
