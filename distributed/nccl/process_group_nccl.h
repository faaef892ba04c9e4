// ProcessGroupNCCL: collectives on CUDA tensors through NCCL (built only with CUDA).
//
// Rank 0 makes the NCCL unique id and hands it out through the store; every rank drives one
// GPU (options.cuda_device, or rank % device_count()). Collectives are queued on the group's
// own stream after the work already queued on the caller's current stream; the returned Work
// finishes when the GPU has finished. Work::wait blocks the host, polling the communicator for
// asynchronous errors; past options.timeout the communicator is aborted and wait() raises an
// ember::Error naming the operation, the world size and this rank. After a failure the group
// refuses further collectives.
#pragma once
#include <memory>

#include "distributed/process_group.h"

namespace ember::distributed {

class ProcessGroupNCCL : public ProcessGroup {
 public:
  // Raises ember::Error when no GPU is usable, or when a rank does not join within the timeout.
  ProcessGroupNCCL(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options = {});
  ~ProcessGroupNCCL() override;
  ProcessGroupNCCL(const ProcessGroupNCCL&) = delete;
  ProcessGroupNCCL& operator=(const ProcessGroupNCCL&) = delete;

  std::string backend_name() const override { return "nccl"; }
  int cuda_device() const;

  std::shared_ptr<Work> allreduce(Tensor tensor, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> broadcast(Tensor tensor, int root = 0) override;
  std::vector<Tensor> allgather(const Tensor& tensor) override;
  // ncclAllGather on the group's stream; in place when input is this rank's chunk of output.
  std::shared_ptr<Work> allgather_into(Tensor output, const Tensor& input) override;
  std::shared_ptr<Work> reduce_scatter(Tensor output, const Tensor& input, ReduceOp op = ReduceOp::Sum) override;
  void barrier() override;
  std::vector<Bytes> allgather_bytes(const Bytes& mine) override;

  class Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace ember::distributed
