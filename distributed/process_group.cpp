#include "distributed/process_group.h"

#include "core/error.h"
#include "distributed/process_group_gloo.h"
#if defined(EMBER_WITH_NCCL)
#include "distributed/nccl/process_group_nccl.h"
#endif

namespace ember::distributed {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "unknown";
}

std::shared_ptr<Store> group_key_space(const std::shared_ptr<Store>& store, int rank) {
  EMBER_CHECK(store != nullptr, "process group: the store is null");
  const int64_t n = store->add("ember_pg_created/" + std::to_string(rank), 1);
  return std::make_shared<PrefixStore>("ember_pg" + std::to_string(n), store);
}

std::shared_ptr<ProcessGroup> new_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                const std::string& backend, ProcessGroupOptions options) {
  if (backend == "gloo") return std::make_shared<ProcessGroupGloo>(std::move(store), rank, size, options);
  if (backend == "nccl") {
#if defined(EMBER_WITH_NCCL)
    return std::make_shared<ProcessGroupNCCL>(std::move(store), rank, size, options);
#else
    EMBER_FAIL("new_process_group: backend 'nccl' needs a build with CUDA (this one has none); use 'gloo'");
#endif
  }
  EMBER_FAIL("new_process_group: unknown backend '", backend, "' (expected 'gloo' or 'nccl')");
}

}  // namespace ember::distributed
