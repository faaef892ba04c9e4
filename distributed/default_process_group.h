// The process group collectives use when none is named, as torch.distributed's default group:
// AcceleratorState sets it to the group it creates (accelerate/accelerator_state.h), and a
// program that builds its own group may set it. Layers that synchronise on their own (a
// SyncBatchNorm built without a group) read it when they run, not when they are built.
#pragma once
#include <memory>

#include "distributed/process_group.h"

namespace ember::distributed {

// nullptr clears it. Thread-safe.
void set_default_process_group(std::shared_ptr<ProcessGroup> pg);
// The group last set, or nullptr (a single process, or none created yet).
std::shared_ptr<ProcessGroup> default_process_group();

}  // namespace ember::distributed
